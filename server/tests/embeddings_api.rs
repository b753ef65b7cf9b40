//! `/embedding` and `/v1/embeddings` on a tiny model, as llama-server documents them: one row a
//! token without pooling, pooled and normalised rows otherwise, OpenAI's list with usage and
//! base64, and the inputs and errors of both endpoints.

mod common;

use base64::Engine as _;
use common::{assert_error, Env};
use serde_json::{json, Value};

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn unit(v: Vec<f64>) -> Vec<f64> {
    let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    v.iter().map(|x| x / norm).collect()
}

fn assert_near(a: &[f64], b: &[f64], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    let worst = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max);
    assert!(worst < 1e-4, "{what}: differs by {worst}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_embeddings_are_the_token_rows_pooled_and_normalised() {
    let env = Env::new();
    // Without pooling: one row a token, as computed.
    let none = env.start(&["--embedding", "-np", "2"]).await;
    let text = "the cat sat on the mat";
    let (_, toks) = none.post("/tokenize", &json!({ "content": text })).await;
    let n_tokens = toks["tokens"].as_array().unwrap().len();
    let (status, r) = none.post("/embedding", &json!({ "content": text })).await;
    assert_eq!(status, 200, "{r}");
    let rows: Vec<Vec<f64>> = r[0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(floats)
        .collect();
    assert_eq!(r[0]["index"], 0);
    assert_eq!(rows.len(), n_tokens);
    assert!(rows
        .iter()
        .all(|row| row.len() == rows[0].len() && row.len() > 1));
    // Unnormalised: the rows are the final norm's output, not unit vectors.
    let norm0 = rows[0].iter().map(|x| x * x).sum::<f64>().sqrt();
    assert!((norm0 - 1.0).abs() > 1e-2, "row norm {norm0}");
    // Causal: a longer input's first rows are the shorter input's rows.
    let (_, longer) = none
        .post(
            "/embedding",
            &json!({ "content": format!("{text} and slept") }),
        )
        .await;
    let longer: Vec<Vec<f64>> = longer[0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(floats)
        .collect();
    for (i, row) in rows.iter().enumerate() {
        assert_near(row, &longer[i], &format!("row {i} of the longer input"));
    }
    // OpenAI's endpoint cannot carry one row a token.
    let (status, r) = none.post("/v1/embeddings", &json!({ "input": text })).await;
    assert_eq!(status, 400, "{r}");
    assert_error(&r, 400);
    none.stop().await;

    let mean_of: Vec<f64> = (0..rows[0].len())
        .map(|d| rows.iter().map(|r| r[d]).sum::<f64>() / rows.len() as f64)
        .collect();
    for (pooling, want) in [
        ("mean", unit(mean_of)),
        ("last", unit(rows[rows.len() - 1].clone())),
        ("cls", unit(rows[0].clone())),
    ] {
        let srv = env.start(&["--embedding", "--pooling", pooling]).await;
        let (status, r) = srv.post("/v1/embeddings", &json!({ "input": text })).await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["object"], "list");
        assert_eq!(r["data"][0]["object"], "embedding");
        assert_eq!(r["usage"]["prompt_tokens"], n_tokens);
        assert_eq!(r["usage"]["total_tokens"], n_tokens);
        assert_near(&floats(&r["data"][0]["embedding"]), &want, pooling);
        // llama-server's endpoint gives the same vector as a list of one row.
        let (_, native) = srv.post("/embedding", &json!({ "content": text })).await;
        assert_near(&floats(&native[0]["embedding"][0]), &want, pooling);
        // No normalisation when the request asks for none.
        let (_, raw) = srv
            .post(
                "/embedding",
                &json!({ "content": text, "embd_normalize": -1 }),
            )
            .await;
        let raw = floats(&raw[0]["embedding"][0]);
        assert_near(&unit(raw.clone()), &want, pooling);
        assert!((raw.iter().map(|x| x * x).sum::<f64>().sqrt() - 1.0).abs() > 1e-3);
        srv.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_inputs_forms_base64_and_errors() {
    let env = Env::new();
    let srv = env
        .start(&["--embedding", "--pooling", "last", "-np", "2"])
        .await;
    let (status, r) = srv
        .post(
            "/v1/embeddings",
            &json!({ "input": ["hello world", "abc", "hello world", [104, 105], {"prompt_string": "abc"},
                {"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]}] }),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    let data = r["data"].as_array().unwrap();
    assert_eq!(data.len(), 6);
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["index"], i);
    }
    // The same text gives the same vector wherever it is in the request and however it is
    // written; another text another vector.
    let v: Vec<Vec<f64>> = data.iter().map(|d| floats(&d["embedding"])).collect();
    assert_near(&v[0], &v[2], "repeated input");
    assert_near(&v[0], &v[5], "content parts");
    assert_near(&v[1], &v[4], "prompt_string");
    assert!(v[0].iter().zip(&v[1]).any(|(a, b)| (a - b).abs() > 1e-3));
    let (_, single) = srv.post("/v1/embeddings", &json!({ "input": "abc" })).await;
    assert_near(
        &floats(&single["data"][0]["embedding"]),
        &v[1],
        "alone or in a batch",
    );

    // base64: the same floats, little-endian f32.
    let (status, r) = srv
        .post(
            "/v1/embeddings",
            &json!({ "input": "abc", "encoding_format": "base64" }),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(r["data"][0]["embedding"].as_str().unwrap())
        .unwrap();
    let decoded: Vec<f64> = bytes
        .chunks_exact(4)
        .map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap())))
        .collect();
    assert_near(&decoded, &v[1], "base64");

    for bad in [
        json!({}),
        json!({ "input": [] }),
        json!({ "input": true }),
        json!({ "input": "" }),
        json!({ "input": "abc", "encoding_format": 1 }),
        json!({ "input": { "content": "abc" } }),
        json!({ "input": { "content": [{ "type": "unknown" }] } }),
        json!({ "input": [999_999] }),
        json!({ "input": "x".repeat(2000) }),
    ] {
        let (status, r) = srv.post("/v1/embeddings", &bad).await;
        assert_eq!(status, 400, "{bad}: {r}");
        assert_eq!(r["error"]["type"], "invalid_request_error", "{bad}: {r}");
    }
    let (status, r) = srv
        .post("/v1/embeddings", &json!({ "input": { "content": [{ "type": "image_url", "image_url": { "url": "data:," } }] } }))
        .await;
    assert_eq!(status, 501, "{r}");
    // `dimensions` other than the model's width is refused, not ignored; the width itself is
    // served.
    let (status, r) = srv
        .post(
            "/v1/embeddings",
            &json!({ "input": "abc", "dimensions": 8 }),
        )
        .await;
    assert_eq!(status, 501, "{r}");
    let width = v[1].len();
    let (status, r) = srv
        .post(
            "/v1/embeddings",
            &json!({ "input": "abc", "dimensions": width }),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    // Generation still works beside embeddings.
    let (status, r) = srv
        .post("/completion", &json!({ "prompt": "abc", "n_predict": 3 }))
        .await;
    assert_eq!(status, 200, "{r}");
    srv.stop().await;

    // Without --embedding the endpoints say how to turn them on.
    let plain = env.start(&[]).await;
    for path in ["/v1/embeddings", "/embedding"] {
        let (status, r) = plain.post(path, &json!({ "input": "abc" })).await;
        assert_eq!(status, 501, "{r}");
        assert!(
            r["error"]["message"]
                .as_str()
                .unwrap()
                .contains("--embedding"),
            "{r}"
        );
    }
    plain.stop().await;
}
