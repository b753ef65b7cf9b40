//! Grammars built to exhaust a stack or the compiler get a 400 in one line of the project's
//! words, while another client's stream goes on. (The server runs in this test's process: a
//! stack overflow anywhere in it aborts the test.)

mod common;

use common::{assert_error, Env};
use engine::testing::{rule_chain, schema_chain};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_grammars_get_a_400_while_a_stream_goes_on() {
    let env = Env::new();
    let srv = env
        .start(&["-np", "2", "-c", "4096", "--max-body", "8MiB"])
        .await;
    let mut stream = srv.endless_stream(3000).await;

    let nested = format!("root ::= {}\"a\"{}", "(".repeat(3000), ")".repeat(3000));
    let alternatives: Vec<String> = (0..20_000).map(|i| format!("\"x{i}\"")).collect();
    let cases = [
        (
            "a chain of 1,000 rules",
            json!({"grammar": rule_chain(1000, false)}),
            "chain",
        ),
        ("3,000 nested groups", json!({"grammar": nested}), "nest"),
        (
            "20,000 alternatives",
            json!({"grammar": format!("root ::= {}", alternatives.join(" | "))}),
            "too large",
        ),
        (
            "a Lark chain of 20,000 rules",
            json!({"grammar": format!("%llguidance {{}}\n{}", rule_chain(20_000, true))}),
            "lines",
        ),
        (
            "a schema chain of 5,000 references",
            json!({"json_schema": schema_chain(5000)}),
            "objects",
        ),
    ];
    for (what, mut body, said) in cases {
        body["prompt"] = json!("hello");
        body["n_predict"] = json!(4);
        let (status, resp) = srv.post("/completion", &body).await;
        assert_eq!(status, 400, "{what}: {resp}");
        assert_error(&resp, 400);
        let msg = resp["error"]["message"].as_str().unwrap();
        assert!(msg.contains(said), "{what}: {msg}");
        assert!(!msg.contains('\n'), "{what}: {msg}");
        for leak in ["panic", "backtrace", ".rs", "src/"] {
            assert!(!msg.contains(leak), "{what}: {leak:?} in {msg}");
        }
    }

    // The same on the chat endpoint, through a schema of its response format.
    let (status, resp) = srv
        .post(
            "/v1/chat/completions",
            &json!({
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
                "response_format": {"type": "json_schema",
                                    "json_schema": {"schema": schema_chain(5000)}},
            }),
        )
        .await;
    assert_eq!(status, 400, "{resp}");
    assert_error(&resp, 400);

    // The stream went on meanwhile and still goes on; a grammar within bounds still works.
    assert!(stream.chunk().await.unwrap().is_some());
    let (status, resp) = srv
        .post(
            "/completion",
            &json!({"prompt": "hello", "n_predict": 8, "grammar": rule_chain(50, false)}),
        )
        .await;
    assert_eq!(status, 200, "{resp}");
    drop(stream);
    srv.stop().await;
}
