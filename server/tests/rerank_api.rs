//! `/rerank` and its other names on a tiny model without a classifier head, as llama-server
//! serves them: each document's score is the first float of the last token's final-norm output
//! over the query's and the document's tokens (what `/embedding` gives as that prompt's last
//! row), the results sorted by score and cut to `top_n`, Jina's shape with `usage` and TEI's
//! bare list, and the errors llama.cpp's own tests ask for.

mod common;

use common::{assert_error, Env, TestServer};
use serde_json::{json, Value};

const QUERY: &str = "Machine learning is";
const DOCUMENTS: &[&str] = &[
    "A machine is a physical system that uses power.",
    "Learning is the process of acquiring new understanding.",
    "Machine learning is a field of study in artificial intelligence.",
    "Paris, capitale de la France, est une grande ville.",
];

async fn tokens(s: &TestServer, text: &str) -> Vec<Value> {
    let (status, r) = s.post("/tokenize", &json!({ "content": text })).await;
    assert_eq!(status, 200, "{r}");
    r["tokens"].as_array().unwrap().clone()
}

/// `(index, score)` of each result, in the response's order.
fn results(list: &Value, label: &str) -> Vec<(usize, f64)> {
    list.as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .map(|r| {
            (
                r["index"].as_u64().unwrap() as usize,
                r[label].as_f64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_are_scored_sorted_and_cut() {
    let env = Env::new();
    // The oracle: the unpooled embeddings of each prompt, from a server without reranking.
    let embed = env.start(&["--embedding"]).await;
    let mut want = Vec::new();
    let mut n_tokens = 0;
    for doc in DOCUMENTS {
        let prompt: Vec<Value> = [tokens(&embed, QUERY).await, tokens(&embed, doc).await].concat();
        n_tokens += prompt.len();
        let (status, r) = embed
            .post("/embedding", &json!({ "content": prompt }))
            .await;
        assert_eq!(status, 200, "{r}");
        let rows = r[0]["embedding"].as_array().unwrap();
        assert_eq!(rows.len(), prompt.len());
        want.push(rows.last().unwrap()[0].as_f64().unwrap());
    }
    // Without --rerank there is no reranking.
    let (status, r) = embed
        .post(
            "/rerank",
            &json!({ "query": QUERY, "documents": DOCUMENTS }),
        )
        .await;
    assert_eq!(status, 501, "{r}");
    assert_error(&r, 501);
    embed.stop().await;

    let s = env.start(&["--rerank", "-np", "2"]).await;
    let body = json!({ "query": QUERY, "documents": DOCUMENTS });
    for path in ["/rerank", "/v1/rerank", "/reranking", "/v1/reranking"] {
        let (status, r) = s.post(path, &body).await;
        assert_eq!(status, 200, "{path}: {r}");
        assert_eq!(r["object"], "list");
        assert!(r["model"].is_string(), "{r}");
        assert_eq!(r["usage"]["prompt_tokens"], n_tokens, "{path}: {r}");
        assert_eq!(r["usage"]["total_tokens"], n_tokens);
        let got = results(&r["results"], "relevance_score");
        assert_eq!(got.len(), DOCUMENTS.len());
        for (i, score) in &got {
            assert!(
                (score - want[*i]).abs() < 1e-4,
                "{path}: document {i} scored {score}, its last row's first float is {}",
                want[*i]
            );
        }
        assert!(got.windows(2).all(|p| p[0].1 >= p[1].1), "sorted: {got:?}");
    }
    // `top_n` keeps the best; more than there are keeps all. The body's model is echoed.
    let (_, all) = s.post("/rerank", &body).await;
    let all = results(&all["results"], "relevance_score");
    for (top_n, n) in [(2, 2), (4, 4), (99, 4), (0, 0)] {
        let mut b = body.clone();
        b["top_n"] = json!(top_n);
        b["model"] = json!("mine");
        let (status, r) = s.post("/rerank", &b).await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["model"], "mine");
        assert_eq!(
            results(&r["results"], "relevance_score"),
            all[..n],
            "{top_n}"
        );
    }
    // TEI's shape: a bare list, `score`, `text` on request.
    let tei = json!({ "query": QUERY, "texts": DOCUMENTS, "return_text": true, "top_n": 3 });
    let (status, r) = s.post("/rerank", &tei).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(results(&r, "score"), all[..3]);
    for item in r.as_array().unwrap() {
        let i = item["index"].as_u64().unwrap() as usize;
        assert_eq!(item["text"], DOCUMENTS[i]);
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_and_embeddings_are_refused() {
    let env = Env::new();
    let s = env.start(&["--rerank"]).await;
    for bad in [
        json!({ "query": QUERY, "documents": [] }),
        json!({ "query": QUERY, "documents": null }),
        json!({ "query": QUERY, "documents": 123 }),
        json!({ "query": QUERY, "documents": [1, 2, 3] }),
        json!({ "documents": DOCUMENTS }),
        json!({ "query": 5, "documents": DOCUMENTS }),
        json!({ "query": QUERY, "documents": DOCUMENTS, "top_n": -1 }),
    ] {
        let (status, r) = s.post("/rerank", &bad).await;
        assert_eq!(status, 400, "{bad}: {r}");
        assert_error(&r, 400);
    }
    // A prompt longer than a slot's context.
    let long = "x".repeat(600);
    let (status, r) = s
        .post("/rerank", &json!({ "query": QUERY, "documents": [long] }))
        .await;
    assert_eq!(status, 400, "{r}");
    // `--rerank` serves no embeddings.
    let (status, r) = s.post("/embedding", &json!({ "content": "hi" })).await;
    assert_eq!(status, 501, "{r}");
    s.stop().await;

    // With `--embedding --pooling rank`, reranking is served and the embeddings endpoints say
    // why they give nothing.
    let s = env.start(&["--embedding", "--pooling", "rank"]).await;
    let (status, r) = s
        .post("/rerank", &json!({ "query": QUERY, "documents": ["a"] }))
        .await;
    assert_eq!(status, 200, "{r}");
    for path in ["/embedding", "/v1/embeddings"] {
        let (status, r) = s.post(path, &json!({ "input": "hi" })).await;
        assert_eq!(status, 400, "{path}: {r}");
        assert!(r.to_string().contains("rerank"), "{r}");
    }
    s.stop().await;
}
