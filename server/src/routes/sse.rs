//! Server-sent event streams, the one way every streaming endpoint answers: OpenAI's chat and
//! completion chunks (`data:` lines, `data: [DONE]` last), llama-server's `/completion` and the
//! named events of the Anthropic Messages and Responses APIs (`event:` then `data:`); Ollama's
//! NDJSON lines take the same path with frames of their own.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::generate::Run;
use crate::error::{Result, ServerError};
use crate::scheduler::Event;

/// The payload of the last event of OpenAI's streams, after every choice has ended.
pub(super) const DONE: &str = "[DONE]";

/// One server-sent event with a name: its name and its JSON.
pub(super) type Named = (&'static str, Value);

/// One event of a stream, as it is written.
pub(super) trait Frame: Send + 'static {
    /// The response's `Content-Type`: server-sent events unless the frames are of another
    /// kind (Ollama's NDJSON lines).
    const CONTENT_TYPE: &'static str = "text/event-stream";

    /// The event's lines and the blank line that ends it.
    fn frame(&self) -> String;
}

/// An event without a name: `data: PAYLOAD`.
impl Frame for String {
    fn frame(&self) -> String {
        format!("data: {self}\n\n")
    }
}

/// An event with a name: `event: NAME` then `data: JSON`.
impl Frame for Named {
    fn frame(&self) -> String {
        format!("event: {}\ndata: {}\n\n", self.0, self.1)
    }
}

/// A server-sent event stream over several generations: `format` turns each event of run
/// `index` into events, and `closing` follows once every run has ended (not after a failure,
/// whose events end the stream). The first event of the first run is awaited before the
/// response starts, so a request that fails at once gets its error status. When the client
/// leaves, the stream and with it the receivers are dropped, which cancels the generations.
pub(super) async fn stream<T, F>(runs: Vec<Run>, mut format: F, closing: Vec<T>) -> Result<Response>
where
    T: Frame,
    F: FnMut(usize, Event) -> Vec<T> + Send + 'static,
{
    let (merged_tx, mut merged) = mpsc::unbounded_channel::<(usize, Event)>();
    let n_runs = runs.len();
    for mut run in runs {
        let tx = merged_tx.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tx.closed() => return,
                    ev = run.rx.recv() => match ev {
                        Some(ev) => {
                            let last = matches!(ev, Event::Done(_) | Event::Failed(_));
                            if tx.send((run.index, ev)).is_err() || last {
                                return;
                            }
                        }
                        None => return,
                    },
                }
            }
        });
    }
    drop(merged_tx);
    let first = match merged.recv().await {
        Some((_, Event::Failed(e))) => return Err(e),
        Some(ev) => ev,
        None => return Err(ServerError::ShuttingDown),
    };
    let (tx, body_rx) = mpsc::channel::<std::result::Result<Bytes, Infallible>>(64);
    tokio::spawn(async move {
        let mut next = Some(first);
        let mut ended = 0;
        loop {
            let (index, ev) = match next.take() {
                Some(ev) => ev,
                None => tokio::select! {
                    _ = tx.closed() => return,
                    ev = merged.recv() => match ev {
                        Some(ev) => ev,
                        None => break,
                    },
                },
            };
            let done = matches!(ev, Event::Done(_) | Event::Failed(_));
            let failed = matches!(ev, Event::Failed(_));
            for event in format(index, ev) {
                if tx.send(Ok(Bytes::from(event.frame()))).await.is_err() {
                    return;
                }
            }
            if failed {
                return;
            }
            if done {
                ended += 1;
                if ended == n_runs {
                    break;
                }
            }
        }
        for event in closing {
            if tx.send(Ok(Bytes::from(event.frame()))).await.is_err() {
                return;
            }
        }
    });
    Ok((
        [
            (header::CONTENT_TYPE, T::CONTENT_TYPE),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(ReceiverStream::new(body_rx)),
    )
        .into_response())
}
