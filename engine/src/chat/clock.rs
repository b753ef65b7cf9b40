//! Local time for templates (`strftime_now`, `date_string`), without a time-zone library: the
//! zone is `TZ` (a zoneinfo name, a TZif path, or a POSIX rule such as `EST5EDT,M3.2.0,M11.1.0`)
//! or `/etc/localtime`, read as TZif, with the POSIX rule in its footer for times after its last
//! transition. Where none can be read, local time is UTC.

use std::time::{SystemTime, UNIX_EPOCH};

/// A moment in local time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalTime {
    pub year: i64,
    /// 1..=12.
    pub month: u32,
    /// 1..=31.
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    /// 0 = Sunday.
    pub weekday: u32,
    /// 1..=366.
    pub yday: u32,
    /// Seconds east of UTC.
    pub offset: i64,
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day number (days since 1970-01-01).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn is_leap(y: i64) -> bool {
    y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)
}

fn month_days(y: i64, m: u32) -> u32 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// `unix` seconds shifted by `offset` seconds east of UTC.
pub fn at(unix: i64, offset: i64) -> LocalTime {
    let local = unix + offset;
    let days = local.div_euclid(86_400);
    let secs = local.rem_euclid(86_400) as u32;
    let (year, month, day) = civil_from_days(days);
    LocalTime {
        year,
        month,
        day,
        hour: secs / 3600,
        minute: secs / 60 % 60,
        second: secs % 60,
        weekday: (days + 4).rem_euclid(7) as u32,
        yday: (days - days_from_civil(year, 1, 1) + 1) as u32,
        offset,
    }
}

/// The current local time.
pub fn now() -> LocalTime {
    let unix = match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    };
    at(unix, local_offset(unix))
}

/// Seconds east of UTC of the local zone at `unix`.
pub fn local_offset(unix: i64) -> i64 {
    let tz = std::env::var("TZ").ok();
    let tz = tz.as_deref().map(|s| s.strip_prefix(':').unwrap_or(s));
    let file = match tz {
        None => std::fs::read("/etc/localtime").ok(),
        Some("") => return 0,
        Some(name) if name.starts_with('/') => std::fs::read(name).ok(),
        Some(name) if !name.contains("..") => {
            std::fs::read(format!("/usr/share/zoneinfo/{name}")).ok()
        }
        Some(_) => None,
    };
    if let Some(offset) = file.and_then(|f| tzif_offset(&f, unix)) {
        return offset;
    }
    tz.and_then(PosixRule::parse)
        .map_or(0, |rule| rule.offset(unix))
}

/// The offset at `unix` in a TZif file.
pub fn tzif_offset(data: &[u8], unix: i64) -> Option<i64> {
    let header = |d: &[u8]| -> Option<(u8, [usize; 6])> {
        if d.len() < 44 || &d[..4] != b"TZif" {
            return None;
        }
        let mut counts = [0usize; 6];
        for (i, c) in counts.iter_mut().enumerate() {
            let b = &d[20 + 4 * i..24 + 4 * i];
            *c = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
        }
        Some((d[4], counts))
    };
    let (version, counts) = header(data)?;
    // [isutcnt, isstdcnt, leapcnt, timecnt, typecnt, charcnt]
    let v1_len = |c: [usize; 6], time: usize| {
        c[3] * time + c[3] + c[4] * 6 + c[5] + c[2] * (time + 4) + c[1] + c[0]
    };
    let (data, counts, time_size) = if version >= b'2' {
        let rest = data.get(44 + v1_len(counts, 4)..)?;
        let (_, c) = header(rest)?;
        (rest, c, 8)
    } else {
        (data, counts, 4)
    };
    let body = data.get(44..44 + v1_len(counts, time_size))?;
    let (timecnt, typecnt) = (counts[3], counts[4]);
    let time = |i: usize| -> i64 {
        let b = &body[i * time_size..(i + 1) * time_size];
        if time_size == 8 {
            i64::from_be_bytes(b.try_into().unwrap_or([0; 8]))
        } else {
            i64::from(i32::from_be_bytes(b.try_into().unwrap_or([0; 4])))
        }
    };
    let idx = &body[timecnt * time_size..timecnt * (time_size + 1)];
    let types = &body[timecnt * (time_size + 1)..timecnt * (time_size + 1) + typecnt * 6];
    let utoff = |t: usize| -> Option<i64> {
        let b = types.get(t * 6..t * 6 + 4)?;
        Some(i64::from(i32::from_be_bytes([b[0], b[1], b[2], b[3]])))
    };
    let after_last = timecnt == 0 || unix >= time(timecnt - 1);
    if after_last && time_size == 8 {
        let footer = data.get(44 + v1_len(counts, time_size)..)?;
        let footer = std::str::from_utf8(footer).ok()?.trim_matches('\n');
        if let Some(rule) = PosixRule::parse(footer) {
            return Some(rule.offset(unix));
        }
    }
    match (0..timecnt).rev().find(|&i| time(i) <= unix) {
        Some(i) => utoff(usize::from(idx[i])),
        None => utoff(0),
    }
}

/// A date rule of a POSIX TZ string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DateRule {
    /// `Mm.w.d`: day `d` (0 = Sunday) of week `w` (5 = last) of month `m`.
    Month(u32, u32, u32),
    /// `Jn`: day 1..=365, February 29 never counted.
    Julian(u32),
    /// `n`: day 0..=365, leap days counted.
    Zero(u32),
}

impl DateRule {
    /// Days since the epoch of the rule's day in `year`.
    fn day(self, year: i64) -> i64 {
        let jan1 = days_from_civil(year, 1, 1);
        match self {
            DateRule::Month(m, w, d) => {
                let first = days_from_civil(year, m, 1);
                let wd = (first + 4).rem_euclid(7) as u32;
                let mut mday = 1 + (d + 7 - wd) % 7 + 7 * (w.saturating_sub(1));
                while mday > month_days(year, m) {
                    mday -= 7;
                }
                first + i64::from(mday) - 1
            }
            DateRule::Julian(n) => {
                let n = i64::from(n) - 1;
                jan1 + n + i64::from(is_leap(year) && n >= 59)
            }
            DateRule::Zero(n) => jan1 + i64::from(n),
        }
    }
}

/// A POSIX TZ rule: standard offset, and optionally daylight time with its start and end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PosixRule {
    std: i64,
    dst: Option<(i64, DateRule, i64, DateRule, i64)>,
}

impl PosixRule {
    /// Parses e.g. `UTC0`, `CET-1CEST,M3.5.0,M10.5.0/3`, `<+0330>-3:30`.
    pub fn parse(s: &str) -> Option<PosixRule> {
        let mut p = Parser { s: s.as_bytes() };
        p.name()?;
        let std = -p.offset()?;
        if p.s.is_empty() {
            return Some(PosixRule { std, dst: None });
        }
        p.name()?;
        let dst = if matches!(p.s.first(), Some(b',') | None) {
            std + 3600
        } else {
            -p.offset()?
        };
        if !p.eat(b',') {
            // Daylight time without rules: the US rules are POSIX's default.
            let start = (DateRule::Month(3, 2, 0), 7200);
            let end = (DateRule::Month(11, 1, 0), 7200);
            return Some(PosixRule {
                std,
                dst: Some((dst, start.0, start.1, end.0, end.1)),
            });
        }
        let (start, start_t) = p.date()?;
        if !p.eat(b',') {
            return None;
        }
        let (end, end_t) = p.date()?;
        Some(PosixRule {
            std,
            dst: Some((dst, start, start_t, end, end_t)),
        })
    }

    /// Seconds east of UTC at `unix`.
    pub fn offset(&self, unix: i64) -> i64 {
        let Some((dst, start, start_t, end, end_t)) = self.dst else {
            return self.std;
        };
        let year = civil_from_days((unix + self.std).div_euclid(86_400)).0;
        let begins = start.day(year) * 86_400 + start_t - self.std;
        let ends = end.day(year) * 86_400 + end_t - dst;
        let in_dst = if begins < ends {
            begins <= unix && unix < ends
        } else {
            !(ends <= unix && unix < begins)
        };
        if in_dst {
            dst
        } else {
            self.std
        }
    }
}

struct Parser<'a> {
    s: &'a [u8],
}

impl Parser<'_> {
    fn eat(&mut self, c: u8) -> bool {
        if self.s.first() == Some(&c) {
            self.s = &self.s[1..];
            true
        } else {
            false
        }
    }

    fn name(&mut self) -> Option<()> {
        if self.eat(b'<') {
            let end = self.s.iter().position(|&c| c == b'>')?;
            self.s = &self.s[end + 1..];
            return Some(());
        }
        let n = self
            .s
            .iter()
            .take_while(|c| c.is_ascii_alphabetic())
            .count();
        self.s = &self.s[n..];
        (n >= 3).then_some(())
    }

    fn number(&mut self) -> Option<i64> {
        let n = self.s.iter().take_while(|c| c.is_ascii_digit()).count();
        let v = std::str::from_utf8(&self.s[..n]).ok()?.parse().ok()?;
        self.s = &self.s[n..];
        Some(v)
    }

    /// `[+-]hh[:mm[:ss]]` in seconds, as written (POSIX offsets are west of UTC).
    fn offset(&mut self) -> Option<i64> {
        let sign = if self.eat(b'-') {
            -1
        } else {
            self.eat(b'+');
            1
        };
        let mut secs = self.number()? * 3600;
        if self.eat(b':') {
            secs += self.number()? * 60;
            if self.eat(b':') {
                secs += self.number()?;
            }
        }
        Some(sign * secs)
    }

    fn date(&mut self) -> Option<(DateRule, i64)> {
        let rule = if self.eat(b'M') {
            let m = self.number()?;
            self.eat(b'.').then_some(())?;
            let w = self.number()?;
            self.eat(b'.').then_some(())?;
            let d = self.number()?;
            if !(1..=12).contains(&m) || !(1..=5).contains(&w) || d > 6 {
                return None;
            }
            DateRule::Month(m as u32, w as u32, d as u32)
        } else if self.eat(b'J') {
            DateRule::Julian(self.number()?.clamp(1, 365) as u32)
        } else {
            DateRule::Zero(self.number()?.clamp(0, 365) as u32)
        };
        let time = if self.eat(b'/') { self.offset()? } else { 7200 };
        Some((rule, time))
    }
}

/// Python's `strftime` for the directives templates use (`%d %b %Y %B %m %H %M %S %a %A %y %j %p
/// %I %e %z %Z %%`, and glibc's `%-d`-style unpadded forms); others pass through as written.
pub fn strftime(t: &LocalTime, format: &str) -> String {
    const DAYS: [&str; 7] = [
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
    ];
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let unpadded = chars.peek() == Some(&'-');
        if unpadded {
            chars.next();
        }
        let num = |v: u32, width: usize| {
            if unpadded {
                v.to_string()
            } else {
                format!("{v:0width$}")
            }
        };
        let hour12 = if t.hour.is_multiple_of(12) {
            12
        } else {
            t.hour % 12
        };
        let month = MONTHS[(t.month as usize + 11) % 12];
        let day = DAYS[t.weekday as usize % 7];
        match chars.next() {
            Some('d') => out += &num(t.day, 2),
            Some('e') => out += &format!("{:2}", t.day),
            Some('m') => out += &num(t.month, 2),
            Some('Y') => out += &t.year.to_string(),
            Some('y') => out += &num(t.year.rem_euclid(100) as u32, 2),
            Some('H') => out += &num(t.hour, 2),
            Some('I') => out += &num(hour12, 2),
            Some('M') => out += &num(t.minute, 2),
            Some('S') => out += &num(t.second, 2),
            Some('j') => out += &num(t.yday, 3),
            Some('p') => out += if t.hour < 12 { "AM" } else { "PM" },
            Some('b') | Some('h') => out += &month[..3],
            Some('B') => out += month,
            Some('a') => out += &day[..3],
            Some('A') => out += day,
            Some('w') => out += &t.weekday.to_string(),
            Some('z') => {
                let sign = if t.offset < 0 { '-' } else { '+' };
                let o = t.offset.abs();
                out += &format!("{sign}{:02}{:02}", o / 3600, o / 60 % 60);
            }
            Some('Z') => out += if t.offset == 0 { "UTC" } else { "" },
            Some('F') => out += &format!("{}-{:02}-{:02}", t.year, t.month, t.day),
            Some('T') => out += &format!("{:02}:{:02}:{:02}", t.hour, t.minute, t.second),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates_round_trip() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        for z in (-800_000..800_000).step_by(997) {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z);
        }
        // 2024-07-26 12:34:56 UTC, a Friday, day 208.
        let t = at(1_721_997_296, 0);
        assert_eq!((t.year, t.month, t.day), (2024, 7, 26));
        assert_eq!(
            (t.hour, t.minute, t.second, t.weekday, t.yday),
            (12, 34, 56, 5, 208)
        );
        assert_eq!(strftime(&t, "%d %b %Y"), "26 Jul 2024");
        assert_eq!(strftime(&t, "%b %d %Y"), "Jul 26 2024");
        assert_eq!(
            strftime(&t, "%A %B %-d, %y %I:%M %p %j %% %Q"),
            "Friday July 26, 24 12:34 PM 208 % %Q"
        );
        let t = at(1_721_997_296, -4 * 3600 - 1800);
        assert_eq!(strftime(&t, "%H:%M %z %a"), "08:04 -0430 Fri");
    }

    #[test]
    fn posix_rules() {
        let utc = PosixRule::parse("UTC0").unwrap();
        assert_eq!(utc.offset(1_721_997_296), 0);
        let ny = PosixRule::parse("EST5EDT,M3.2.0,M11.1.0").unwrap();
        // 2024-03-10 06:59:59 UTC is 01:59:59 EST; a second later it is 03:00 EDT.
        let start = days_from_civil(2024, 3, 10) * 86_400 + 7 * 3600;
        assert_eq!(ny.offset(start - 1), -5 * 3600);
        assert_eq!(ny.offset(start), -4 * 3600);
        // 2024-11-03 06:00 UTC is 02:00 EDT, back to 01:00 EST.
        let end = days_from_civil(2024, 11, 3) * 86_400 + 6 * 3600;
        assert_eq!(ny.offset(end - 1), -4 * 3600);
        assert_eq!(ny.offset(end), -5 * 3600);
        // Southern hemisphere: Sydney, daylight time from October to April.
        let syd = PosixRule::parse("AEST-10AEDT,M10.1.0,M4.1.0/3").unwrap();
        assert_eq!(syd.offset(days_from_civil(2024, 1, 15) * 86_400), 11 * 3600);
        assert_eq!(syd.offset(days_from_civil(2024, 7, 15) * 86_400), 10 * 3600);
        let tehran = PosixRule::parse("<+0330>-3:30").unwrap();
        assert_eq!(tehran.offset(0), 3 * 3600 + 1800);
        assert_eq!(PosixRule::parse("1"), None);
    }

    #[test]
    fn reads_the_system_zone_files_when_present() {
        // UTC's zone file, where the system has one, says 0; Kolkata's says +05:30.
        for (name, want) in [("UTC", 0), ("Asia/Kolkata", 19_800)] {
            if let Ok(f) = std::fs::read(format!("/usr/share/zoneinfo/{name}")) {
                assert_eq!(tzif_offset(&f, 1_721_997_296), Some(want), "{name}");
            }
        }
    }
}
