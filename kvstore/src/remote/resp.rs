//! A Redis connection that reads replies straight into their final buffers: the remote tier's
//! hot path (pipelined `GET`s of megabyte values) costs one copy from the socket, where a
//! general client parses through a growing buffer and copies each value again. The `redis` crate parses the
//! URL; commands and replies are RESP2, only the few this tier sends. `rediss://` runs them over
//! TLS ([`super::tls`], feature `tls`).

use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
#[cfg(unix)]
use std::os::unix::net::UnixStream;
use std::time::Duration;

#[cfg(feature = "tls")]
use super::tls::{Session, Tls};

/// The largest value a reply may carry (a block record is far smaller); a longer length is a
/// protocol error, not an allocation.
const MAX_BULK: usize = 1 << 30;
/// The longest status or error line.
const MAX_LINE: usize = 64 << 10;
/// Commands of [`Conn::pipeline_within`] sent before the first reply tells their size.
const FIRST_IN_FLIGHT: usize = 2;
/// The most commands [`Conn::pipeline_within`] keeps awaiting replies, however small.
const MAX_IN_FLIGHT: usize = 64;

/// Why a call failed.
#[derive(Debug)]
pub(super) enum Failure {
    /// The connection failed (I/O, a timeout, a reply that does not parse): it is dropped.
    Lost(io::Error),
    /// The server answered with an error (`-OOM …`, `-READONLY …`): the connection is fine.
    Refused(String),
    /// The TLS handshake failed: the server's certificate did not verify (an unknown CA,
    /// another name, expired), or the server refused the session or does not speak TLS.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    Tls(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Lost(e) => write!(f, "{e}"),
            Failure::Refused(m) => write!(f, "{m}"),
            Failure::Tls(m) => write!(f, "TLS: {m}"),
        }
    }
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Failure::Lost(e)
    }
}

fn bad(what: impl Into<String>) -> Failure {
    Failure::Lost(io::Error::new(io::ErrorKind::InvalidData, what.into()))
}

/// A TCP or Unix socket, or a TLS session over TCP.
enum Stream {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(UnixStream),
    #[cfg(feature = "tls")]
    Tls(Session),
}

impl Stream {
    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            #[cfg(unix)]
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => Stream::Tls(s.share()),
        })
    }

    fn set_timeouts(&self, t: Duration) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => {
                s.set_nodelay(true)?;
                s.set_read_timeout(Some(t))?;
                s.set_write_timeout(Some(t))
            }
            #[cfg(unix)]
            Stream::Unix(s) => {
                s.set_read_timeout(Some(t))?;
                s.set_write_timeout(Some(t))
            }
            // Set on its socket before the handshake.
            #[cfg(feature = "tls")]
            Stream::Tls(_) => Ok(()),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            #[cfg(unix)]
            Stream::Unix(s) => s.read(buf),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            #[cfg(unix)]
            Stream::Unix(s) => s.write(buf),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            #[cfg(unix)]
            Stream::Unix(s) => s.flush(),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// Where a server is and how to log in, from its URL.
#[derive(Clone, Debug)]
pub(super) struct Target {
    addr: Addr,
    username: Option<String>,
    password: Option<String>,
    db: i64,
    /// For `rediss://`.
    #[cfg(feature = "tls")]
    tls: Option<Tls>,
}

#[derive(Clone, Debug)]
enum Addr {
    Tcp(String, u16),
    #[cfg(unix)]
    Unix(std::path::PathBuf),
}

impl Target {
    /// Parses `url`: `redis://`, `redis+unix://`, or `rediss://` (TLS, feature `tls`), whose
    /// server certificate must chain to `ca` (a PEM file) when given, else to a system CA, and
    /// name the URL's host; its fragment `#insecure` (as the `redis` crate's URLs have it)
    /// skips both checks. `ca` with another scheme is refused: the connection would not be
    /// encrypted.
    pub(super) fn parse(url: &str, ca: Option<&std::path::Path>) -> Result<Target, String> {
        use redis::IntoConnectionInfo;
        // The `redis` crate parses `rediss://` only with its own TLS compiled in: the URL is
        // parsed as `redis://`, its fragment (meaningful only with TLS) taken first.
        let (tls, url) = match url
            .strip_prefix("rediss://")
            .or_else(|| url.strip_prefix("valkeys://"))
        {
            Some(rest) => {
                let (rest, fragment) = rest.split_once('#').unwrap_or((rest, ""));
                let insecure = match fragment {
                    "" => false,
                    "insecure" => true,
                    other => return Err(format!("#{other}: only #insecure may follow the URL")),
                };
                (Some(insecure), format!("redis://{rest}"))
            }
            None => (None, url.to_owned()),
        };
        if tls.is_none() && ca.is_some() {
            return Err("a CA file is only used with a rediss:// (TLS) URL".into());
        }
        let info = url.into_connection_info().map_err(|e| e.to_string())?;
        let addr = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port) => Addr::Tcp(host.clone(), *port),
            #[cfg(unix)]
            redis::ConnectionAddr::Unix(path) => Addr::Unix(path.clone()),
            other => return Err(format!("{other:?} is not supported")),
        };
        #[cfg(feature = "tls")]
        let tls = match (tls, &addr) {
            (Some(insecure), Addr::Tcp(host, _)) => Some(Tls::new(host, insecure, ca)?),
            _ => None,
        };
        #[cfg(not(feature = "tls"))]
        if tls.is_some() {
            return Err("TLS is not compiled in (kvstore's feature `tls`)".into());
        }
        let r = info.redis_settings();
        Ok(Target {
            addr,
            username: r.username().map(str::to_owned),
            password: r.password().map(str::to_owned),
            db: r.db(),
            #[cfg(feature = "tls")]
            tls,
        })
    }
}

/// One reply.
#[derive(Debug)]
pub(super) enum Reply {
    /// `+OK` and the like.
    Status,
    /// `:N`.
    Int(i64),
    /// `$N` (`None`: nil).
    Bulk(Option<Vec<u8>>),
    /// `*N` (`None`: nil). Read whole, so that the connection stays in step, though no
    /// command the tier sends now expects one.
    #[cfg_attr(not(test), allow(dead_code))]
    Array(Option<Vec<Reply>>),
}

/// A connection: commands written through a small buffer (large values go straight to the
/// socket), replies read through one.
pub(super) struct Conn {
    reader: BufReader<Stream>,
    writer: BufWriter<Stream>,
}

impl Conn {
    /// Connects within `timeout`, sets it on every read and write (the TLS handshake's too),
    /// logs in and selects the database.
    pub(super) fn open(target: &Target, timeout: Duration) -> Result<Conn, Failure> {
        let stream = match &target.addr {
            Addr::Tcp(host, port) => {
                let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
                let mut found = None;
                for a in (host.as_str(), *port).to_socket_addrs()? {
                    match TcpStream::connect_timeout(&a, timeout) {
                        Ok(s) => {
                            found = Some(s);
                            break;
                        }
                        Err(e) => last = e,
                    }
                }
                Stream::Tcp(found.ok_or(last)?)
            }
            #[cfg(unix)]
            Addr::Unix(path) => Stream::Unix(UnixStream::connect(path)?),
        };
        stream.set_timeouts(timeout)?;
        #[cfg(feature = "tls")]
        let stream = match (&target.tls, stream) {
            (Some(tls), Stream::Tcp(tcp)) => Stream::Tls(tls.connect(tcp)?),
            (_, stream) => stream,
        };
        let mut conn = Conn {
            reader: BufReader::with_capacity(64 << 10, stream.try_clone()?),
            writer: BufWriter::with_capacity(64 << 10, stream),
        };
        if let Some(password) = &target.password {
            let mut args: Vec<&[u8]> = vec![b"AUTH"];
            if let Some(user) = &target.username {
                args.push(user.as_bytes());
            }
            args.push(password.as_bytes());
            conn.call(&args)?;
        }
        if target.db != 0 {
            let db = target.db.to_string();
            conn.call(&[b"SELECT", db.as_bytes()])?;
        }
        Ok(conn)
    }

    /// Reads `want` bytes (a value and its CRLF) into a buffer of their own: what the reader
    /// holds first, then the rest from the socket itself. std reads a `TcpStream` or
    /// `UnixStream` into uninitialised capacity, but through a wrapper without that ability
    /// (`Stream`, or the `BufReader` over it) it zeroes every buffer before reading into it, a
    /// second pass over each megabyte. A TLS session (rustls, on stable Rust) has no such
    /// ability: its values are read from it directly all the same, under one lock.
    fn read_bulk(&mut self, want: usize) -> io::Result<Vec<u8>> {
        let mut value = Vec::with_capacity(want);
        let buffered = self.reader.buffer();
        let k = buffered.len().min(want);
        value.extend_from_slice(&buffered[..k]);
        self.reader.consume(k);
        let rest = (want - k) as u64;
        if rest > 0 {
            match self.reader.get_mut() {
                Stream::Tcp(s) => (&mut *s).take(rest).read_to_end(&mut value)?,
                #[cfg(unix)]
                Stream::Unix(s) => (&mut *s).take(rest).read_to_end(&mut value)?,
                #[cfg(feature = "tls")]
                Stream::Tls(s) => (&mut *s.lock()?).take(rest).read_to_end(&mut value)?,
            };
        }
        Ok(value)
    }

    /// Writes one command.
    fn send(&mut self, args: &[&[u8]]) -> io::Result<()> {
        write!(self.writer, "*{}\r\n", args.len())?;
        for a in args {
            write!(self.writer, "${}\r\n", a.len())?;
            self.writer.write_all(a)?;
            self.writer.write_all(b"\r\n")?;
        }
        Ok(())
    }

    /// One command and its reply.
    pub(super) fn call(&mut self, args: &[&[u8]]) -> Result<Reply, Failure> {
        self.send(args)?;
        self.writer.flush()?;
        self.read_reply(0)
    }

    /// Several commands in one write, then their replies in order; the first refusal among
    /// them is returned after every reply was read (the connection stays in step).
    pub(super) fn pipeline(&mut self, commands: &[Vec<&[u8]>]) -> Result<Vec<Reply>, Failure> {
        let mut replies = Vec::with_capacity(commands.len());
        self.pipeline_from(commands, commands.len(), usize::MAX, &mut |r| {
            replies.push(r);
            true
        })?;
        Ok(replies)
    }

    /// Like [`Conn::pipeline`], but with only about `budget` bytes of replies outstanding, and
    /// each reply handed to `each` as it arrives: the next commands are sent as replies come
    /// in, as many as the last reply's size says fit in the budget (at least one, at most
    /// [`MAX_IN_FLIGHT`]). A server that has to hold every reply of a long pipeline at once
    /// (Redis buffers them all before writing) builds them in fresh memory each time; a few at
    /// a time, it reuses the same buffers, and the caller works on one reply while the next is
    /// made. When `each` returns false, no further command is sent; the replies of those
    /// already sent are read and dropped (the connection stays in step). Returns how many
    /// commands were sent.
    pub(super) fn pipeline_within(
        &mut self,
        commands: &[Vec<&[u8]>],
        budget: usize,
        each: &mut dyn FnMut(Reply) -> bool,
    ) -> Result<usize, Failure> {
        self.pipeline_from(commands, FIRST_IN_FLIGHT, budget, each)
    }

    /// The pipelines: `first` commands sent at once, then as `budget` allows.
    fn pipeline_from(
        &mut self,
        commands: &[Vec<&[u8]>],
        first: usize,
        budget: usize,
        each: &mut dyn FnMut(Reply) -> bool,
    ) -> Result<usize, Failure> {
        let mut sent = 0;
        let mut window = first.max(1);
        let mut wanted = true;
        let mut refused = None;
        let mut read = 0;
        while read < commands.len() {
            let upto = if wanted {
                (read + window).min(commands.len())
            } else {
                sent
            };
            if sent < upto {
                for c in &commands[sent..upto] {
                    self.send(c)?;
                }
                sent = upto;
                self.writer.flush()?;
            }
            if read == sent {
                break;
            }
            read += 1;
            let reply = match self.read_reply(0) {
                Ok(r) => r,
                Err(Failure::Refused(m)) => {
                    refused.get_or_insert(m);
                    Reply::Status
                }
                Err(e) => return Err(e),
            };
            if let Reply::Bulk(Some(v)) = &reply {
                window = (budget / v.len().max(1)).clamp(1, MAX_IN_FLIGHT);
            }
            if wanted {
                wanted = each(reply);
            }
        }
        match refused {
            Some(m) => Err(Failure::Refused(m)),
            None => Ok(sent),
        }
    }

    /// A line without its CRLF.
    fn line(&mut self) -> Result<Vec<u8>, Failure> {
        let mut line = Vec::new();
        let n = (&mut self.reader)
            .take(MAX_LINE as u64)
            .read_until(b'\n', &mut line)?;
        if n == 0 {
            return Err(Failure::Lost(io::ErrorKind::UnexpectedEof.into()));
        }
        if !line.ends_with(b"\r\n") {
            return Err(bad("a reply line without CRLF"));
        }
        line.truncate(line.len() - 2);
        Ok(line)
    }

    fn number(bytes: &[u8]) -> Result<i64, Failure> {
        std::str::from_utf8(bytes)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("a bad number in a reply"))
    }

    fn read_reply(&mut self, depth: usize) -> Result<Reply, Failure> {
        if depth > 2 {
            return Err(bad("a reply nested too deep"));
        }
        let line = self.line()?;
        let (kind, rest) = line.split_first().ok_or_else(|| bad("an empty reply"))?;
        match kind {
            b'+' => Ok(Reply::Status),
            b'-' => Err(Failure::Refused(String::from_utf8_lossy(rest).into_owned())),
            b':' => Ok(Reply::Int(Self::number(rest)?)),
            b'$' => {
                let n = Self::number(rest)?;
                if n < 0 {
                    return Ok(Reply::Bulk(None));
                }
                let n = usize::try_from(n).map_err(|_| bad("a bad length"))?;
                if n > MAX_BULK {
                    return Err(bad(format!("a value of {n} bytes")));
                }
                let mut value = self.read_bulk(n + 2)?;
                if value.len() != n + 2 || !value.ends_with(b"\r\n") {
                    return Err(bad("a value cut short"));
                }
                value.truncate(n);
                Ok(Reply::Bulk(Some(value)))
            }
            b'*' => {
                let n = Self::number(rest)?;
                if n < 0 {
                    return Ok(Reply::Array(None));
                }
                let n = usize::try_from(n).map_err(|_| bad("a bad length"))?;
                if n > 1 << 20 {
                    return Err(bad(format!("an array of {n} replies")));
                }
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.read_reply(depth + 1)?);
                }
                Ok(Reply::Array(Some(items)))
            }
            _ => Err(bad("an unknown reply type")),
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    /// A connection whose server is `script`: the bytes it answers with, whatever is asked.
    fn scripted(script: impl Into<Vec<u8>>) -> Conn {
        let script: Vec<u8> = script.into();
        let (ours, theirs) = UnixStream::pair().unwrap();
        std::thread::spawn(move || {
            let mut theirs = theirs;
            let _ = theirs.write_all(&script);
            // Keep the socket open a moment so a short script reads as cut, not closed early.
            std::thread::sleep(Duration::from_millis(200));
        });
        let stream = Stream::Unix(ours);
        stream.set_timeouts(Duration::from_secs(2)).unwrap();
        Conn {
            reader: BufReader::with_capacity(16, stream.try_clone().unwrap()),
            writer: BufWriter::new(stream),
        }
    }

    #[test]
    fn values_nils_numbers_and_arrays_are_read_whole() {
        let mut c = scripted(b"*3\r\n$5\r\nhello\r\n$-1\r\n$0\r\n\r\n:7\r\n+OK\r\n");
        match c.call(&[b"MGET", b"a", b"b", b"c"]).unwrap() {
            Reply::Array(Some(items)) => {
                assert!(matches!(&items[0], Reply::Bulk(Some(v)) if v == b"hello"));
                assert!(matches!(&items[1], Reply::Bulk(None)));
                assert!(matches!(&items[2], Reply::Bulk(Some(v)) if v.is_empty()));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(c.call(&[b"EXISTS", b"a"]).unwrap(), Reply::Int(7)));
        assert!(matches!(c.call(&[b"PING"]).unwrap(), Reply::Status));
    }

    #[test]
    fn large_values_back_to_back_are_read_whole_and_in_step() {
        // Values far larger than the reader's buffer: each is read partly from what the
        // reader holds and partly from the socket directly.
        let values: Vec<Vec<u8>> = (0..3u8)
            .map(|i| {
                (0..300_000u32)
                    .map(|j| (j as u8).wrapping_mul(i + 1))
                    .collect()
            })
            .collect();
        let mut script = b"*3\r\n".to_vec();
        for v in &values {
            script.extend_from_slice(format!("${}\r\n", v.len()).as_bytes());
            script.extend_from_slice(v);
            script.extend_from_slice(b"\r\n");
        }
        script.extend_from_slice(b":5\r\n");
        let mut c = scripted(script);
        match c.call(&[b"MGET", b"a", b"b", b"c"]).unwrap() {
            Reply::Array(Some(items)) => {
                for (item, want) in items.iter().zip(&values) {
                    assert!(matches!(item, Reply::Bulk(Some(v)) if v == want));
                }
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(c.call(&[b"EXISTS", b"a"]).unwrap(), Reply::Int(5)));
    }

    #[test]
    fn a_budgeted_pipeline_keeps_few_large_values_in_flight_and_stays_in_step() {
        const VALUE: usize = 1 << 20;
        const N: usize = 12;
        let (ours, theirs) = UnixStream::pair().unwrap();
        // The server: before each reply, waits for that command, then notes how many more
        // had arrived (commands the client sent ahead of the replies it had read).
        let server = std::thread::spawn(move || {
            let mut theirs = BufReader::new(theirs);
            let mut received = 0;
            let mut most_ahead = 0;
            let mut line = String::new();
            let mut command = |r: &mut BufReader<UnixStream>| {
                // `*2`, `$3`, `GET`, `$2`, the key: five lines.
                for _ in 0..5 {
                    line.clear();
                    r.read_line(&mut line).unwrap();
                }
            };
            for i in 0..N {
                while received <= i {
                    command(&mut theirs);
                    received += 1;
                }
                theirs.get_ref().set_nonblocking(true).unwrap();
                std::thread::sleep(Duration::from_millis(20));
                while received < N && !theirs.fill_buf().map_or(true, <[u8]>::is_empty) {
                    theirs.get_ref().set_nonblocking(false).unwrap();
                    command(&mut theirs);
                    received += 1;
                    theirs.get_ref().set_nonblocking(true).unwrap();
                }
                theirs.get_ref().set_nonblocking(false).unwrap();
                most_ahead = most_ahead.max(received - i - 1);
                let mut reply = format!("${VALUE}\r\n").into_bytes();
                reply.extend(std::iter::repeat_n(i as u8, VALUE));
                reply.extend_from_slice(b"\r\n");
                theirs.get_mut().write_all(&reply).unwrap();
            }
            // `EXISTS a`: five lines too.
            command(&mut theirs);
            theirs.get_mut().write_all(b":1\r\n").unwrap();
            most_ahead
        });
        let stream = Stream::Unix(ours);
        stream.set_timeouts(Duration::from_secs(5)).unwrap();
        let mut c = Conn {
            reader: BufReader::new(stream.try_clone().unwrap()),
            writer: BufWriter::new(stream),
        };
        let keys: Vec<String> = (0..N).map(|i| format!("k{i}")).collect();
        let commands: Vec<Vec<&[u8]>> = keys
            .iter()
            .map(|k| vec![&b"GET"[..], k.as_bytes()])
            .collect();
        let mut replies = Vec::new();
        let sent = c
            .pipeline_within(&commands, 3 * VALUE, &mut |r| {
                replies.push(r);
                true
            })
            .unwrap();
        assert_eq!(sent, N);
        assert_eq!(replies.len(), N);
        for (i, r) in replies.iter().enumerate() {
            assert!(
                matches!(r, Reply::Bulk(Some(v)) if v.len() == VALUE && v.iter().all(|&b| b == i as u8)),
                "{i}"
            );
        }
        assert!(matches!(c.call(&[b"EXISTS", b"a"]).unwrap(), Reply::Int(1)));
        let ahead = server.join().unwrap();
        // Three values' worth in flight: the one being answered and two more at most.
        assert!((1..=2).contains(&ahead), "{ahead} commands were sent ahead");
    }

    #[test]
    fn a_pipeline_told_to_stop_sends_nothing_more_and_stays_in_step() {
        // Two commands go out before the first reply; told to stop at it, the pipeline reads
        // the second's reply and sends none of the other eight.
        let mut c = scripted(b"$1\r\na\r\n$1\r\nb\r\n:1\r\n");
        let keys: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
        let commands: Vec<Vec<&[u8]>> = keys
            .iter()
            .map(|k| vec![&b"GET"[..], k.as_bytes()])
            .collect();
        let mut seen = Vec::new();
        let sent = c
            .pipeline_within(&commands, 1 << 20, &mut |r| {
                seen.push(r);
                false
            })
            .unwrap();
        assert_eq!(sent, FIRST_IN_FLIGHT);
        assert!(matches!(&seen[..], [Reply::Bulk(Some(v))] if v == b"a"));
        assert!(matches!(c.call(&[b"EXISTS", b"a"]).unwrap(), Reply::Int(1)));
    }

    #[test]
    fn a_refusal_inside_a_pipeline_keeps_the_connection_in_step() {
        let mut c = scripted(b"+OK\r\n-OOM command not allowed\r\n+OK\r\n:1\r\n");
        let set: Vec<&[u8]> = vec![b"SET", b"k", b"v"];
        match c.pipeline(&[set.clone(), set.clone(), set]) {
            Err(Failure::Refused(m)) => assert!(m.starts_with("OOM")),
            other => panic!("{other:?}"),
        }
        // The next reply is the next command's, not a leftover.
        assert!(matches!(c.call(&[b"EXISTS", b"k"]).unwrap(), Reply::Int(1)));
    }

    #[test]
    fn cut_oversized_and_malformed_replies_lose_the_connection() {
        for script in [
            &b"$10\r\nshort"[..],
            b"$5\r\nhelloXX",
            b"$99999999999\r\n",
            b"*2000000\r\n",
            b"$abc\r\n",
            b"?\r\n",
            b"+OK\n",
            b"*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
            b"",
        ] {
            let mut c = scripted(script);
            match c.call(&[b"GET", b"k"]) {
                Err(Failure::Lost(_)) => {}
                other => panic!("{:?}: {other:?}", String::from_utf8_lossy(script)),
            }
        }
    }

    #[test]
    fn urls_name_the_server_and_its_login() {
        let t = Target::parse("redis://app:s3cret@db.example:6380/3", None).unwrap();
        assert!(matches!(&t.addr, Addr::Tcp(h, 6380) if h == "db.example"));
        assert_eq!(t.username.as_deref(), Some("app"));
        assert_eq!(t.password.as_deref(), Some("s3cret"));
        assert_eq!(t.db, 3);
        assert!(Target::parse("not a url", None).is_err());
    }

    #[test]
    fn rediss_urls_take_tls_their_login_and_only_the_insecure_fragment() {
        let ca = std::env::temp_dir().join(format!("llama-hdd-no-ca-{}", std::process::id()));
        std::fs::write(&ca, "not PEM").unwrap();
        // A CA file makes no sense without TLS.
        let no_tls = Target::parse("redis://db.example:6380", Some(&ca)).unwrap_err();
        assert!(no_tls.contains("rediss://"), "{no_tls}");
        let fragment = Target::parse("rediss://db.example:6380#verify", None).unwrap_err();
        assert!(fragment.contains("#insecure"), "{fragment}");
        #[cfg(feature = "tls")]
        {
            // A CA file without a certificate is refused, as is a missing one.
            let not_pem = Target::parse("rediss://db.example:6380", Some(&ca)).unwrap_err();
            assert!(not_pem.contains("no PEM certificate"), "{not_pem}");
            let missing = Target::parse("rediss://db.example", Some(&ca.with_extension("x")));
            assert!(missing.unwrap_err().contains("CA file"));
            let t = Target::parse("rediss://:pw@db.example:6380/2#insecure", None).unwrap();
            assert!(matches!(&t.addr, Addr::Tcp(h, 6380) if h == "db.example"));
            assert_eq!((t.password.as_deref(), t.db), (Some("pw"), 2));
            assert!(t.tls.is_some());
            assert!(Target::parse("redis://db.example:6380", None)
                .unwrap()
                .tls
                .is_none());
        }
        #[cfg(not(feature = "tls"))]
        assert!(Target::parse("rediss://db.example:6380", None).is_err());
        let _ = std::fs::remove_file(&ca);
    }
}
