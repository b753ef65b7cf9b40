//! Hostile chat templates in the renderer process: a template that asks for terabytes or runs for
//! minutes fails its render with a typed error, the calling process carries on, and the next
//! render gets a fresh renderer. The renderer is this test executable, started with a filter that
//! runs only `renderer_entry`.

use std::time::{Duration, Instant};

use engine::chat::sandbox::{self, Limits};
use engine::chat::{ChatTemplate, Message, CHATML_TEMPLATE};
use engine::Error;

/// The renderer's `main`: serves and exits when started as the renderer, does nothing otherwise.
#[test]
fn renderer_entry() {
    sandbox::serve_if_renderer();
}

const LIMITS: Limits = Limits {
    memory_bytes: 512 << 20,
    time: Duration::from_secs(3),
};

fn turn_on() {
    let exe = std::env::current_exe().expect("the test executable");
    let args = [
        "renderer_entry",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ];
    sandbox::enable(exe, args.iter().map(Into::into).collect(), LIMITS);
}

fn messages() -> Vec<Message> {
    vec![
        Message::new("system", "Be brief."),
        Message::new("user", "Hi \"there\"\n\u{1F600}"),
    ]
}

fn renderer_error(r: engine::Result<String>) -> String {
    match r {
        Err(Error::TemplateRenderer(m)) => m,
        other => panic!("expected a renderer error, got {other:?}"),
    }
}

/// One test: the sandbox is per process, and the cases share its renderer on purpose.
#[test]
fn hostile_templates_fail_in_the_renderer_and_the_caller_carries_on() {
    turn_on();
    let plain = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}\
                 {% if add_generation_prompt %}{{ bos_token }}>{% endif %}";
    let t = ChatTemplate::new(plain, "<s>", "</s>").unwrap();
    assert!(!t.is_reviewed());
    let want = t.render_here(&messages(), true).unwrap();
    assert_eq!(t.render(&messages(), true).unwrap(), want);
    assert!(want.ends_with("<s>>"), "{want}");

    // Exponential growth: each step doubles a string through a namespace.
    let doubling = "{% set ns = namespace(x='ab') %}{% for i in range(60) %}\
                    {% set ns.x = ns.x ~ ns.x %}{% endfor %}{{ ns.x|length }}";
    let t = ChatTemplate::new(doubling, "", "").unwrap();
    let started = Instant::now();
    let e = renderer_error(t.render(&messages(), true));
    assert!(
        e.contains("died") && e.contains("512 MiB") && e.contains("memory allocation"),
        "{e}"
    );
    assert!(started.elapsed() < LIMITS.time, "{:?}", started.elapsed());

    // The next render starts a new renderer.
    let t = ChatTemplate::new(plain, "<s>", "</s>").unwrap();
    assert_eq!(t.render(&messages(), true).unwrap(), want);

    // A renderer killed between renders (as a Ctrl-C in the terminal would) is replaced.
    let pid = sandbox::active().unwrap().renderer_pid().unwrap();
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    std::thread::sleep(Duration::from_millis(100));
    let t = ChatTemplate::new(plain, "<s>", "</s>").unwrap();
    assert_eq!(t.render(&messages(), true).unwrap(), want);
    assert_ne!(sandbox::active().unwrap().renderer_pid(), Some(pid));

    // One instruction that walks two billion items.
    let long = "{{ [1] * 2000000000 }}";
    let t = ChatTemplate::new(long, "", "").unwrap();
    let started = Instant::now();
    let e = renderer_error(t.render(&messages(), false));
    assert!(e.contains("longer than 3s"), "{e}");
    assert!(
        started.elapsed() < LIMITS.time * 3,
        "{:?}",
        started.elapsed()
    );

    // Compiling folds constants: an 80 MB string built once per `+`, at load, before any render.
    let folding = format!("{{{{ 'abcd' * 20000000{} }}}}", "+0".repeat(200));
    let started = Instant::now();
    let e = match ChatTemplate::new(&folding, "", "") {
        Err(Error::TemplateRenderer(m)) => m,
        other => panic!("expected a renderer error, got {other:?}"),
    };
    assert!(e.contains("longer than 3s"), "{e}");
    assert!(
        started.elapsed() < LIMITS.time * 3,
        "{:?}",
        started.elapsed()
    );
    // A syntax error found by the renderer's compile is an error at load, as in the process.
    let e = match ChatTemplate::new("{% for %}", "", "") {
        Err(Error::TemplateRenderer(m)) => m,
        other => panic!("expected a renderer error, got {other:?}"),
    };
    assert!(e.contains("syntax error"), "{e}");

    // A template error comes back as text, and the renderer stays.
    let raising = "{{ raise_exception('no ' ~ messages[0].role ~ ' here') }}";
    let t = ChatTemplate::new(raising, "", "").unwrap();
    let e = renderer_error(t.render(&messages(), false));
    assert!(e.contains("no system here"), "{e}");
    let pid = sandbox::active().unwrap().renderer_pid();
    assert!(pid.is_some());
    let t = ChatTemplate::new(plain, "<s>", "</s>").unwrap();
    assert_eq!(t.render(&messages(), true).unwrap(), want);
    assert_eq!(sandbox::active().unwrap().renderer_pid(), pid);

    // Reviewed templates render here (ChatML), with the same text either way.
    let t = ChatTemplate::new(CHATML_TEMPLATE, "", "").unwrap();
    assert!(t.is_reviewed());
    assert_eq!(
        t.render(&messages(), true).unwrap(),
        t.render_here(&messages(), true).unwrap()
    );
}
