//! A program that chose neither the sandbox nor rendering in process cannot render a template
//! that is not reviewed: the render fails with a typed error naming both choices, and nothing
//! of the template runs here. Reviewed templates (ChatML) still render. One test in its own
//! binary: the choice is per process.

use engine::chat::{ChatTemplate, Message};
use engine::Error;

#[test]
fn an_unreviewed_template_is_not_rendered_without_a_choice() {
    // A template that would take terabytes if it ran (see the sandbox module).
    let hostile = "{% set ns = namespace(x='ab') %}{% for i in range(60) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}{{ ns.x|length }}";
    let t = ChatTemplate::new(hostile, "", "").expect("not compiled without a choice");
    assert!(!t.is_reviewed());
    let messages = [Message::new("user", "hi")];
    let e = t.render(&messages, true).unwrap_err();
    assert!(matches!(e, Error::NoSandboxChoice), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("sandbox::init") && text.contains("render_in_process"),
        "{text}"
    );
    let chatml = ChatTemplate::chatml();
    assert!(chatml.is_reviewed());
    assert!(chatml.render(&messages, true).unwrap().contains("hi"));
}
