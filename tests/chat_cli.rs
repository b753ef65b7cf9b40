//! The chat example driven through a pipe, as a script would, on a tiny model the test writes:
//! nothing is lost without being asked (fresh starts, failed resumes, a smaller context, two
//! chats on one name), the commands, option checking, identical replies after a restart, the
//! prompt built from the template's delta, two chats saving into one store at once, and where
//! the store is without `--store` (the user's cache directory; an earlier `./store` named).
//!
//! The chat binary is the example that `cargo test` builds beside the tests; a filtered run
//! needs it built first: `cargo build --example chat && cargo test --test chat_cli`.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::Child;

use engine::KvType;

#[path = "support/chat_env.rs"]
mod chat_env;
use chat_env::{files_under, run, users, Env, Run};

/// Flips one byte in the middle of `path`.
fn corrupt(path: &Path) -> Vec<u8> {
    let original = std::fs::read(path).unwrap();
    let mut bytes = original.clone();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x5A;
    std::fs::write(path, &bytes).unwrap();
    original
}

/// A message long enough that the conversation fills a full 64-token block.
fn long_message() -> String {
    "the quick brown fox jumps over the lazy dog while seven wizards quietly box jugs of liquor"
        .into()
}

#[test]
fn fresh_start_keeps_the_old_conversation() {
    let env = Env::new();
    env.chat(&["--session", "talk"], "hello\n");
    let before = env.restore("talk").unwrap();
    let run = env.chat(&["--session", "talk", "--fresh"], "again\n/quit\n");
    assert!(
        run.stderr.contains("new conversation `talk-2`"),
        "{}",
        run.stderr
    );
    assert_eq!(env.restore("talk").unwrap(), before);
    assert_eq!(users(&before.0), ["hello"]);
    assert_eq!(users(&env.restore("talk-2").unwrap().0), ["again"]);
    // /reset likewise starts a new name and keeps the old one.
    let run = env.chat(&["--session", "talk"], "/reset\nthird\n");
    assert!(
        run.stderr.contains("new conversation `talk-3`"),
        "{}",
        run.stderr
    );
    assert_eq!(env.restore("talk").unwrap(), before);
    assert_eq!(users(&env.restore("talk-3").unwrap().0), ["third"]);
}

#[test]
fn a_failed_resume_keeps_the_old_checkpoint_and_goes_on_under_a_new_name() {
    let env = Env::new();
    // A damaged block.
    env.chat(&["--session", "talk"], &format!("{}\n", long_message()));
    let before = env.restore("talk").unwrap();
    assert!(before.1 > 64, "{} tokens fill no block", before.1);
    let blocks = env.files_in("blocks");
    assert!(!blocks.is_empty());
    let originals: Vec<_> = blocks.iter().map(|b| (b.clone(), corrupt(b))).collect();
    let run = env.chat(&["--session", "talk"], "more\n");
    assert!(
        run.stderr.contains("could not resume `talk`"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("goes on as `talk-2`"), "{}", run.stderr);
    assert_eq!(users(&env.restore("talk-2").unwrap().0), ["more"]);
    // Repaired (the block put back as it was), the old conversation restores whole.
    for (path, bytes) in &originals {
        std::fs::write(path, bytes).unwrap();
    }
    assert_eq!(env.restore("talk").unwrap(), before);

    // A damaged manifest: refused, and left byte for byte as it was.
    env.chat(&["--session", "other"], "hello\n");
    let manifest = env
        .files_in("manifests")
        .into_iter()
        .find(|p| p.file_name().unwrap().to_string_lossy().contains("other"))
        .expect("the manifest of `other`");
    corrupt(&manifest);
    let damaged = std::fs::read(&manifest).unwrap();
    let run = env.chat(&["--session", "other"], "next\n");
    assert!(
        run.stderr.contains("could not resume `other`"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("goes on as `other-2`"),
        "{}",
        run.stderr
    );
    assert_eq!(std::fs::read(&manifest).unwrap(), damaged);
    assert_eq!(users(&env.restore("other-2").unwrap().0), ["next"]);
}

#[test]
fn a_smaller_context_keeps_the_checkpoint() {
    let env = Env::new();
    env.chat(&["--session", "talk"], &format!("{}\n", long_message()));
    let before = env.restore("talk").unwrap();
    let run = env.chat(&["--session", "talk", "--ctx", "32"], "short\n");
    assert!(
        run.stderr.contains("could not resume `talk`"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("goes on as `talk-2`"), "{}", run.stderr);
    assert_eq!(env.restore("talk").unwrap(), before);
    // With the context it needs, it resumes.
    let run = env.chat(&["--session", "talk"], "");
    assert!(
        run.stderr.contains("resumed `talk`: 2 messages"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_second_chat_on_a_name_in_use_gets_a_new_name() {
    let env = Env::new();
    let mut first: Child = env.command(&["--session", "talk"]).spawn().unwrap();
    let mut stderr = BufReader::new(first.stderr.take().unwrap());
    // Wait until the first chat has its name.
    let mut line = String::new();
    while !line.contains("new conversation `talk`") {
        line.clear();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "the first chat ended"
        );
    }
    let second = env.chat(&["--session", "talk"], "from the second\n");
    let pid = first.id().to_string();
    assert!(
        second.stderr.contains("`talk` is open in another chat") && second.stderr.contains(&pid),
        "{}",
        second.stderr
    );
    assert!(
        second.stderr.contains("goes on as `talk-2`"),
        "{}",
        second.stderr
    );
    let mut stdin = first.stdin.take().unwrap();
    stdin.write_all(b"from the first\n/quit\n").unwrap();
    drop(stdin);
    assert!(first.wait().unwrap().success());
    assert_eq!(users(&env.restore("talk").unwrap().0), ["from the first"]);
    assert_eq!(
        users(&env.restore("talk-2").unwrap().0),
        ["from the second"]
    );
}

#[test]
fn commands_save_load_list_branch_undo_delete() {
    let env = Env::new();
    let script = "\
one
/save snap
two
/branch side
three
/list
/undo
/load snap
/delete side
/list
/delete snap
/delete talk
/save
/load nothing-here
/frobnicate
/help
";
    let run = env.chat(&["--session", "talk"], script);
    let err = &run.stderr;
    // /branch: the conversation goes on as `side`; `talk` stays at two turns.
    assert!(err.contains("now on `side`, branched from `talk`"), "{err}");
    let saved = run.numbers_after("(saved `side`:");
    // The branch itself, the turn "three", then /undo.
    assert_eq!(saved.len(), 3, "{err}");
    assert_eq!(saved[2], saved[0], "undo goes back to the branch point");
    let undo_line = err
        .lines()
        .skip_while(|l| !l.contains("took back the last turn"))
        .nth(1)
        .unwrap();
    assert!(undo_line.contains("0 new blocks"), "{undo_line}");
    // The first listing shows all three, the current one marked; the second lacks `side`.
    let (first, second) = run
        .stdout
        .split_once("* snap")
        .expect("a listing on `snap`");
    assert!(
        first.contains("* side") && first.contains("  talk "),
        "{first}"
    );
    assert!(first.contains("  snap "), "{first}");
    assert!(
        second.contains("  talk ") && !second.contains("side"),
        "{second}"
    );
    assert!(err.contains("now on `snap`; `side` is kept"), "{err}");
    assert!(err.contains("deleted `side`"), "{err}");
    // Deleting the conversation in use is refused; bad commands are explained.
    assert!(err.contains("`snap` is the conversation in use"), "{err}");
    assert!(err.contains("deleted `talk`"), "{err}");
    assert!(err.contains("usage: /save NAME"), "{err}");
    assert!(err.contains("no conversation `nothing-here`"), "{err}");
    assert!(err.contains("unknown command /frobnicate"), "{err}");
    assert!(run.stdout.contains("/branch NAME"), "{}", run.stdout);
    assert!(!env.exists("side") && !env.exists("talk"));
    assert_eq!(users(&env.restore("snap").unwrap().0), ["one"]);

    // Undoing the only turn is saved too: a restart does not bring it back.
    env.chat(&["--session", "undone"], "first\n/undo\n");
    assert_eq!(env.restore("undone").unwrap(), (Vec::new(), 0));
}

#[test]
fn bad_options_exit_non_zero_and_write_nothing() {
    let env = Env::new();
    let long = "x".repeat(101);
    let bad: &[&[&str]] = &[
        &["--ctx", "0"],
        &["--threads", "0"],
        &["--temp", "nan"],
        &["--temp", "-1"],
        &["--top-p", "0"],
        &["--top-p", "1.5"],
        &["--min-p", "2"],
        &["--repeat-penalty", "0"],
        &["--max-tokens", "0"],
        &["--session", ""],
        &["--session", "a/b"],
        &["--session", ".."],
        &["--session", "up..there"],
        &["--session", ".hidden"],
        &["--session", &long],
        &["--cache-disk", "12XB"],
        &["--cache-disk", "-5MB"],
        &["--cache-ram", "0"],
        &["--no-such-option"],
    ];
    for args in bad {
        let run = env.run(args, "hello\n");
        assert!(!run.ok, "{args:?} was accepted");
        assert!(run.stderr.contains("error"), "{args:?}: {}", run.stderr);
        assert!(run.stdout.is_empty(), "{args:?}: {}", run.stdout);
        assert!(!env.store().exists(), "{args:?} created the store");
    }
    let run = env.chat(
        &[
            "--cache-disk",
            "50MB",
            "--cache-ram",
            "1GiB",
            "--session",
            "ok",
        ],
        "/quit\n",
    );
    assert!(run.ok);
    if !cfg!(any(feature = "cuda", feature = "metal")) {
        // GPU layers asked of a CPU-only build: refused, saying how to run instead.
        let run = env.run(&["-ngl", "1"], "hello\n");
        assert!(!run.ok, "-ngl 1 was accepted by a CPU-only build");
        assert!(run.stderr.contains("--n-gpu-layers 0"), "{}", run.stderr);
    }
}

#[test]
fn a_restored_conversation_answers_as_it_would_have_without_the_restart() {
    for temp in ["0", "0.9"] {
        let env = Env::new();
        let args = ["--temp", temp, "--max-tokens", "12"];
        let whole = env.chat(
            &[&args[..], &["--session", "one-go"]].concat(),
            "hi\nand then\n",
        );
        let first = env.chat(&[&args[..], &["--session", "split"]].concat(), "hi\n");
        let second = env.chat(&[&args[..], &["--session", "split"]].concat(), "and then\n");
        assert!(
            second.stderr.contains("resumed `split`"),
            "{}",
            second.stderr
        );
        assert_eq!(
            format!("{}{}", first.stdout, second.stdout),
            whole.stdout,
            "temperature {temp}"
        );
        assert_eq!(
            env.restore("split").unwrap().1,
            env.restore("one-go").unwrap().1
        );
    }
}

/// Checks that every turn but the first kept all the tokens the session held after the
/// previous save (the reply's sampled tokens included), and that no turn fell back to
/// re-tokenizing the conversation.
fn assert_every_turn_extends_the_last(run: &Run, name: &str) {
    let kept = run.numbers_after("(prompt:");
    let saved = run.numbers_after(&format!("(saved `{name}`:"));
    assert_eq!(kept.len(), saved.len());
    for i in 1..kept.len() {
        assert_eq!(kept[i], saved[i - 1], "turn {i} of `{name}`");
    }
    assert_eq!(run.count("re-tokenizing"), 0);
}

#[test]
fn a_template_that_does_not_extend_its_prompts_falls_back_and_is_counted() {
    // Prefix-stable ChatML: no fallback.
    let env = Env::new();
    let run = env.chat(&["--session", "t"], "ab\ncd ef\ngh\n");
    assert_every_turn_extends_the_last(&run, "t");
    // A template that starts with the number of messages never extends its previous prompt.
    let counting = "{{ messages|length }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n\
                    {{ m['content'] }}<|im_end|>\n{% endfor %}\
                    {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    let env = Env::with_template(Some(counting));
    let run = env.chat(&["--session", "t"], "ab\ncd ef\ngh\n");
    assert_eq!(
        run.count("re-tokenizing the conversation"),
        2,
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("2 turns re-tokenized"),
        "{}",
        run.stderr
    );
    assert_eq!(users(&env.restore("t").unwrap().0), ["ab", "cd ef", "gh"]);
}

#[test]
fn a_template_that_exhausts_memory_fails_its_turn_in_the_renderer_and_the_chat_goes_on() {
    // ChatML for the first turn; from the second on, a string that doubles sixty times.
    let hostile = "{% if messages|length > 1 %}{% set ns = namespace(x='ab') %}\
                   {% for i in range(60) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}{% endif %}\
                   {% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n\
                   {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    let env = Env::with_template(Some(hostile));
    let run = env.chat(&["--session", "h"], "first\nsecond\n");
    assert!(
        run.stderr.contains("chat template renderer") && run.stderr.contains("memory allocation"),
        "{}",
        run.stderr
    );
    assert_eq!(users(&env.restore("h").unwrap().0), ["first"]);
}

#[test]
fn two_chats_saving_every_turn_into_one_store_both_complete() {
    const TURNS: usize = 200;
    let env = Env::new();
    let script = |tag: &str| {
        let mut s: String = (0..TURNS).map(|i| format!("{tag} {i}\n")).collect();
        s.push_str("/quit\n");
        s
    };
    let args = |name: &'static str| ["--session", name, "--ctx", "8192", "--max-tokens", "2"];
    let spawn = |name: &'static str| {
        let env = &env;
        let input = script(name);
        move || env.run(&args(name), &input)
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(spawn("alpha"));
        let b = s.spawn(spawn("beta"));
        (a.join().unwrap(), b.join().unwrap())
    });
    for (run, name) in [(&a, "alpha"), (&b, "beta")] {
        assert!(run.ok, "{name}: {}", run.stderr);
        assert_eq!(run.count(&format!("(saved `{name}`:")), TURNS, "{name}");
        assert_eq!(run.count("could not"), 0, "{name}: {}", run.stderr);
        assert_every_turn_extends_the_last(run, name);
        let (messages, tokens) = env.restore(name).unwrap();
        assert_eq!(messages.len(), 2 * TURNS, "{name}");
        let want: Vec<String> = (0..TURNS).map(|i| format!("{name} {i}")).collect();
        assert_eq!(users(&messages), want, "{name}");
        assert_eq!(
            Some(&tokens),
            run.numbers_after(&format!("(saved `{name}`:")).last()
        );
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let dest = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

#[test]
fn conversations_in_the_earlier_layout_are_migrated_once_and_left_in_place() {
    let env = Env::new();
    // A model's directory in a store is a bare checkpoint store: the earlier layout.
    let seed = env.dir.path().join("seed");
    let mut cmd = env.command_without_store(&["--session", "old-talk"]);
    cmd.arg("--store").arg(&seed);
    assert!(run(cmd, "hello\n").ok);
    let model_dir = std::fs::read_dir(seed.join("models"))
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    let legacy = env.dir.path().join("sessions");
    copy_dir(&model_dir, &legacy);
    let files_before: Vec<_> = files_under(&legacy)
        .into_iter()
        .map(|p| (p.clone(), std::fs::read(&p).unwrap()))
        .collect();

    // `sessions/` in the working directory goes into the default store.
    let first = run(
        env.command_without_store(&["--session", "old-talk"]),
        "again\n",
    );
    assert!(first.ok, "{}", first.stderr);
    assert!(
        first.stderr.contains("migrated 1 conversations: old-talk"),
        "{}",
        first.stderr
    );
    assert!(
        first.stderr.contains("resumed `old-talk`"),
        "{}",
        first.stderr
    );
    let (messages, _) = env
        .restore_from(&env.default_store(), "old-talk", KvType::F16)
        .unwrap();
    assert_eq!(users(&messages), ["hello", "again"]);
    // `sessions/` is untouched, and the next start does not migrate again.
    for (path, bytes) in &files_before {
        assert_eq!(&std::fs::read(path).unwrap(), bytes, "{}", path.display());
    }
    let second = run(env.command_without_store(&["--session", "old-talk"]), "");
    assert!(!second.stderr.contains("migrated"), "{}", second.stderr);
    assert!(
        second.stderr.contains("resumed `old-talk`: 4 messages"),
        "{}",
        second.stderr
    );
}

#[test]
fn the_default_store_is_in_the_user_cache_directory_and_an_earlier_store_is_named() {
    let env = Env::new();
    let first = run(env.command_without_store(&["--session", "t"]), "hello\n");
    assert!(first.ok, "{}", first.stderr);
    let (messages, _) = env
        .restore_from(&env.default_store(), "t", KvType::F16)
        .unwrap();
    assert_eq!(users(&messages), ["hello"]);
    assert!(!env.store().exists(), "the chat made ./store");
    assert!(!first.stderr.contains("--store store"), "{}", first.stderr);

    // A `./store` of an earlier version: piped input is not asked, but told how to use it, and
    // the chat goes on with the default.
    let mut earlier = env.command_without_store(&["--session", "t"]);
    earlier.args(["--store", "store"]);
    assert!(run(earlier, "old\n").ok);
    let second = run(env.command_without_store(&["--session", "t"]), "again\n");
    assert!(second.ok, "{}", second.stderr);
    assert!(
        second.stderr.contains("./store exists") && second.stderr.contains("`--store store`"),
        "{}",
        second.stderr
    );
    let (messages, _) = env
        .restore_from(&env.default_store(), "t", KvType::F16)
        .unwrap();
    assert_eq!(users(&messages), ["hello", "again"]);
    assert_eq!(users(&env.restore("t").unwrap().0), ["old"]);
}

#[test]
fn a_disk_budget_drops_the_least_recently_used_conversations_and_says_so() {
    let env = Env::new();
    let budget = 30_000u64;
    let mut evicted = Vec::new();
    for i in 0..6 {
        let name = format!("c{i}");
        // Each conversation fills a block of its own.
        let message = format!("{i} {}", long_message());
        let run = env.chat(
            &["--session", &name, "--cache-disk", "30KB"],
            &format!("{message}\n"),
        );
        if let Some(line) = run
            .stderr
            .lines()
            .find(|l| l.contains("dropped the least recently used conversations"))
        {
            evicted.extend(
                line.rsplit_once("conversations ")
                    .unwrap()
                    .1
                    .trim_end_matches(')')
                    .split(", ")
                    .map(str::to_owned),
            );
        }
        let block_bytes: u64 = env
            .files_in("blocks")
            .iter()
            .map(|p| std::fs::metadata(p).unwrap().len())
            .sum();
        assert!(
            block_bytes <= budget,
            "{block_bytes} bytes of blocks after `{name}`"
        );
    }
    assert!(!evicted.is_empty(), "nothing was dropped");
    for name in &evicted {
        assert!(!env.exists(name), "`{name}` was reported dropped");
    }
    // The conversation saved last is kept, whole.
    assert!(!evicted.contains(&"c5".to_owned()));
    assert_eq!(
        users(&env.restore("c5").unwrap().0),
        [format!("5 {}", long_message())]
    );
}

#[test]
fn a_q8_0_store_opens_from_an_f16_chat_only_with_conversion() {
    let env = Env::for_q8_0();
    let q8 = ["-ctk", "q8_0", "-ctv", "q8_0"];
    env.chat(&q8, "hi\n");
    // Blocks and manifests (an open registers the process's owner lock, and drops dead ones').
    let data = || -> Vec<_> {
        files_under(&env.store())
            .into_iter()
            .filter(|p| p.extension().is_none_or(|e| e != "lock"))
            .map(|p| (std::fs::read(&p).unwrap(), p))
            .collect()
    };
    let before = data();

    // The default f16 cache against the q8_0 store: refused with the way out, nothing changed.
    let refused = env.run(&[], "and then\n");
    assert!(!refused.ok, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("q8_0") && refused.stderr.contains("--cache-type-stored q8_0"),
        "{}",
        refused.stderr
    );
    let after = data();
    let changed: Vec<_> = after
        .iter()
        .filter(|a| !before.contains(a))
        .chain(before.iter().filter(|b| !after.contains(b)))
        .map(|f| &f.1)
        .collect();
    assert!(changed.is_empty(), "a refused chat changed {changed:?}");

    // Converting explicitly, the f16 chat resumes it and saves its turn as q8_0; the q8_0 chat
    // resumes the result.
    let converted = env.chat(&["--cache-type-stored", "q8_0"], "and then\n");
    assert!(
        converted.stderr.contains("resumed `default`"),
        "{}",
        converted.stderr
    );
    let again = env.chat(&q8, "more\n");
    assert!(
        again.stderr.contains("resumed `default`"),
        "{}",
        again.stderr
    );
    assert_eq!(
        users(&env.restore_typed("default", KvType::Q8_0).unwrap().0),
        ["hi", "and then", "more"]
    );
}
