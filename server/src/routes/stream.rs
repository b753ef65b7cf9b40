//! Resumable conversation streams, as llama-server keeps them for a web page that reloads
//! mid-reply: a streamed generation request with `X-Conversation-Id: ID` (chat, completions,
//! `/completion`, Responses, Anthropic Messages) is recorded, byte for byte as its client
//! receives it, in a session under `ID` of the request's tenant, and goes on to its end when
//! its client leaves. `GET /v1/stream?conv_id=ID&from=N` replays the session from byte `N` and
//! follows it until the generation ends; `DELETE /v1/stream?conv_id=ID` stops the generation
//! (as a client that leaves stops a plain stream) and forgets the session;
//! `POST /v1/streams/lookup` says which of the ids a client names have sessions. Sessions are
//! the tenant's own ([`super::cache_admin::tenant`]): another key finds none of them.
//!
//! Bounds: a session keeps the last [`SESSION_BYTES`] of its stream (a resume from before
//! them is 400, as llama-server answers); a finished session stays resumable for
//! [`KEEP_FINISHED`], and finished sessions give way, the earliest finished first, while more
//! than [`MAX_SESSIONS`] sessions or [`TOTAL_BYTES`] are held. A live session is never dropped
//! for room (it ends with its generation, or with a stop).

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use http_body_util::BodyExt;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::ReceiverStream;

use super::cache_admin::tenant;
use super::{AppState, ClientKey};
use crate::error::ServerError;

/// The last bytes of its stream a session keeps (llama-server's bound too).
pub const SESSION_BYTES: usize = 4 << 20;

/// How long a finished session stays resumable (llama-server's time to live).
pub const KEEP_FINISHED: Duration = Duration::from_secs(300);

/// Sessions held, all tenants together, past which finished ones give way.
pub const MAX_SESSIONS: usize = 256;

/// Bytes held by all sessions together, past which finished ones give way.
pub const TOTAL_BYTES: usize = 64 << 20;

/// The request header naming a conversation.
const HEADER: &str = "x-conversation-id";

/// The endpoints (after `--api-prefix`) whose streams are recorded: those that llama-server
/// records, less the ones this server lacks (infill, transcriptions).
const RECORDED: &[&str] = &[
    "/completion",
    "/completions",
    "/v1/completions",
    "/chat/completions",
    "/v1/chat/completions",
    "/responses",
    "/v1/responses",
    "/messages",
    "/v1/messages",
];

/// A session's name: the tenant (`None` without keys) and the conversation id.
type Key = (Option<String>, String);

type Map = Mutex<HashMap<Key, Arc<Session>>>;

/// Every tenant's sessions.
#[derive(Clone, Default)]
pub struct Streams {
    map: Arc<Map>,
}

/// One recorded stream.
struct Session {
    /// The conversation id the request named.
    id: String,
    /// When it started (Unix seconds).
    started_unix: u64,
    log: Mutex<Log>,
    /// Bumped after every change of `log`, for the readers that wait on it.
    grown: watch::Sender<()>,
    /// Set by a stop or by a newer request of the same conversation.
    stop: watch::Sender<bool>,
}

/// A session's bytes: the chunks as they were sent, less the oldest past [`SESSION_BYTES`].
#[derive(Default)]
struct Log {
    chunks: VecDeque<Bytes>,
    /// Bytes dropped from the front: the stream offset of the first chunk.
    dropped: usize,
    /// Bytes in `chunks`.
    held: usize,
    /// When the generation ended (and in Unix seconds), once it has.
    ended: Option<(Instant, u64)>,
}

/// A resume from an offset whose bytes were dropped.
struct Lost;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Session {
    fn new(id: String) -> Session {
        Session {
            id,
            started_unix: super::unix_now(),
            log: Mutex::default(),
            grown: watch::channel(()).0,
            stop: watch::channel(false).0,
        }
    }

    fn append(&self, data: Bytes) {
        {
            let mut log = lock(&self.log);
            if log.ended.is_some() || data.is_empty() {
                return;
            }
            log.held += data.len();
            log.chunks.push_back(data);
            while log.held > SESSION_BYTES {
                let excess = log.held - SESSION_BYTES;
                let Some(front) = log.chunks.front_mut() else {
                    break;
                };
                let cut = excess.min(front.len());
                if cut == front.len() {
                    log.chunks.pop_front();
                } else {
                    *front = front.slice(cut..);
                }
                log.held -= cut;
                log.dropped += cut;
            }
        }
        self.grown.send_replace(());
    }

    fn finish(&self) {
        lock(&self.log)
            .ended
            .get_or_insert_with(|| (Instant::now(), super::unix_now()));
        self.grown.send_replace(());
    }

    /// Ends the session and tells its producer to stop the generation.
    fn cancel(&self) {
        self.stop.send_replace(true);
        self.finish();
    }

    /// Completes once the session is cancelled.
    async fn stopped(&self) {
        let mut rx = self.stop.subscribe();
        let _ = rx.wait_for(|&s| s).await;
    }

    /// Whether the bytes from stream offset `from` on were dropped.
    fn lost(&self, from: usize) -> bool {
        from < lock(&self.log).dropped
    }

    /// The bytes from stream offset `from` on, and whether the generation has ended.
    fn read(&self, from: usize) -> Result<(Vec<Bytes>, bool), Lost> {
        let log = lock(&self.log);
        if from < log.dropped {
            return Err(Lost);
        }
        let mut start = log.dropped;
        let mut out = Vec::new();
        for chunk in &log.chunks {
            let end = start + chunk.len();
            if end > from {
                out.push(chunk.slice(from.saturating_sub(start)..));
            }
            start = end;
        }
        Ok((out, log.ended.is_some()))
    }

    fn info(&self) -> Value {
        let log = lock(&self.log);
        json!({
            "conversation_id": self.id,
            "is_done": log.ended.is_some(),
            "total_bytes": log.dropped + log.held,
            "started_at": self.started_unix,
            "completed_at": log.ended.map_or(0, |(_, unix)| unix),
        })
    }
}

/// Drops the expired sessions, then finished ones (the earliest finished first) while the
/// bounds are passed.
fn prune(map: &mut HashMap<Key, Arc<Session>>) {
    let mut finished = Vec::new();
    let mut total = 0;
    map.retain(|key, s| {
        let log = lock(&s.log);
        if let Some((at, _)) = log.ended {
            if at.elapsed() >= KEEP_FINISHED {
                return false;
            }
            finished.push((at, key.clone(), log.held));
        }
        total += log.held;
        true
    });
    finished.sort_by_key(|f| f.0);
    let mut count = map.len();
    for (_, key, held) in finished {
        if count <= MAX_SESSIONS && total <= TOTAL_BYTES {
            break;
        }
        map.remove(&key);
        count -= 1;
        total -= held;
    }
}

impl Streams {
    fn sessions(&self) -> MutexGuard<'_, HashMap<Key, Arc<Session>>> {
        let mut map = lock(&self.map);
        prune(&mut map);
        map
    }

    /// A new session for `key`, cancelling the one it replaces.
    fn open(&self, key: Key) -> Arc<Session> {
        let fresh = Arc::new(Session::new(key.1.clone()));
        let old = self.sessions().insert(key, Arc::clone(&fresh));
        if let Some(old) = old {
            old.cancel();
        }
        fresh
    }

    fn get(&self, key: &Key) -> Option<Arc<Session>> {
        self.sessions().get(key).cloned()
    }

    /// Cancels and forgets `key`'s session, if there is one.
    fn stop(&self, key: &Key) {
        let gone = self.sessions().remove(key);
        if let Some(s) = gone {
            s.cancel();
        }
    }

    /// Forgets `key`'s session if it is still `session` (a request that did not stream).
    fn forget(&self, key: &Key, session: &Arc<Session>) {
        let mut map = self.sessions();
        if map.get(key).is_some_and(|s| Arc::ptr_eq(s, session)) {
            map.remove(key);
        }
        drop(map);
        session.finish();
    }

    /// After a session ended: the bounds kept now, and the age bound once it is reached.
    fn ended(&self) {
        drop(self.sessions());
        let map: Weak<Map> = Arc::downgrade(&self.map);
        tokio::spawn(async move {
            tokio::time::sleep(KEEP_FINISHED).await;
            if let Some(map) = map.upgrade() {
                prune(&mut lock(&map));
            }
        });
    }
}

/// The conversation a request names, when it is a generation whose stream is recorded.
fn conversation_of(st: &AppState, req: &Request) -> Option<String> {
    if req.method() != Method::POST {
        return None;
    }
    let path = req.uri().path();
    let path = path
        .strip_prefix(st.config.args.api_prefix.trim_end_matches('/'))
        .unwrap_or(path);
    if !RECORDED.contains(&path) {
        return None;
    }
    req.headers()
        .get(HEADER)?
        .to_str()
        .ok()
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
}

/// Whether a body asks for a stream (`"stream": true`); anything else is left to the handler.
#[derive(Deserialize)]
struct Streamed {
    #[serde(default)]
    stream: bool,
}

/// Middleware: a streamed generation request with `X-Conversation-Id` runs apart from its
/// connection, its answer recorded in a new session of its conversation (which replaces and
/// stops an older one). Its client gets the same bytes while it stays; the generation goes on
/// without it, until it ends or the session is stopped. An answer that is not a stream (an
/// error) leaves no session; a request that does not stream is served as any other.
pub(super) async fn record(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let Some(id) = conversation_of(&st, &req) else {
        return next.run(req).await;
    };
    let (parts, body) = req.into_parts();
    let limit = st.config.max_body;
    let bytes = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(e) => return body_error(&e, limit).into_response(),
    };
    let streamed = serde_json::from_slice::<Streamed>(&bytes).is_ok_and(|s| s.stream);
    let req = Request::from_parts(parts, Body::from(bytes));
    if !streamed {
        return next.run(req).await;
    }
    let client = req
        .extensions()
        .get::<ClientKey>()
        .copied()
        .unwrap_or_default();
    let key = (tenant(&st, &client), id);
    let session = st.streams.open(key.clone());
    let (head_tx, head_rx) = oneshot::channel();
    let streams = st.streams.clone();
    tokio::spawn(produce(next.run(req), session, streams, key, head_tx));
    head_rx
        .await
        .unwrap_or_else(|_| ServerError::ShuttingDown.into_response())
}

/// A body that could not be read: over the limit (413), or cut short.
fn body_error(e: &axum::Error, limit: usize) -> ServerError {
    let mut source: Option<&dyn std::error::Error> = Some(e);
    while let Some(s) = source {
        if s.is::<http_body_util::LengthLimitError>() {
            return ServerError::BodyTooLarge { limit };
        }
        source = s.source();
    }
    ServerError::BadRequest(e.to_string())
}

/// Runs the handler, hands its response's head to the client through `head_tx` and pulls its
/// body into `session`, passing each chunk on while the client is there.
async fn produce(
    handler: impl std::future::Future<Output = Response> + Send + 'static,
    session: Arc<Session>,
    streams: Streams,
    key: Key,
    head_tx: oneshot::Sender<Response>,
) {
    let resp = tokio::select! {
        r = handler => r,
        () = session.stopped() => {
            streams.forget(&key, &session);
            let stopped = ServerError::BadRequest(
                "request cancelled by a stop of its conversation stream".into(),
            );
            let _ = head_tx.send(stopped.into_response());
            return;
        }
    };
    let is_stream = resp.status() == StatusCode::OK
        && resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
    if !is_stream {
        streams.forget(&key, &session);
        let _ = head_tx.send(resp);
        return;
    }
    let (head, mut body) = resp.into_parts();
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(64);
    let to_client = Response::from_parts(head, Body::from_stream(ReceiverStream::new(rx)));
    let mut client = head_tx.send(to_client).is_ok().then_some(tx);
    loop {
        let frame = tokio::select! {
            f = body.frame() => f,
            () = session.stopped() => break,
        };
        let Some(Ok(frame)) = frame else {
            break;
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        session.append(data.clone());
        if let Some(tx) = &client {
            let gone = tokio::select! {
                r = tx.send(Ok(data)) => r.is_err(),
                () = session.stopped() => break,
            };
            if gone {
                client = None;
            }
        }
    }
    // Dropping the body (and with it the generation's receivers) stops a generation that a
    // stop left unfinished.
    drop(body);
    session.finish();
    streams.ended();
}

/// The query of `GET` and `DELETE /v1/stream`.
#[derive(Deserialize)]
pub(super) struct StreamQuery {
    conv_id: Option<String>,
    from: Option<String>,
}

fn missing_id() -> Response {
    ServerError::BadRequest("Missing conversation id in path".into()).into_response()
}

/// llama-server's answer for an id without a session.
fn not_found() -> Response {
    let body = json!({
        "error": { "code": 404, "message": "Stream not found or expired", "type": "not_found_error" }
    });
    (StatusCode::NOT_FOUND, Json(body)).into_response()
}

/// `GET /v1/stream?conv_id=ID&from=N`: the session's stream from byte `N` (default 0) as
/// server-sent events, as recorded (OpenAI's `data: [DONE]` included where the request's
/// stream had it), then its new bytes as they come, until the generation ends or the session
/// is stopped. 400 without an id, for a bad `from` or one whose bytes were dropped; 404 for an
/// id the tenant has no session of.
pub(super) async fn resume(
    State(st): State<Arc<AppState>>,
    Extension(client): Extension<ClientKey>,
    Query(q): Query<StreamQuery>,
) -> Response {
    let Some(id) = q.conv_id.filter(|id| !id.is_empty()) else {
        return missing_id();
    };
    let Some(session) = st.streams.get(&(tenant(&st, &client), id)) else {
        return not_found();
    };
    let from = match q.from.as_deref().filter(|f| !f.is_empty()) {
        None => 0,
        Some(f) => match f.parse::<usize>() {
            Ok(n) => n,
            Err(_) => {
                return ServerError::BadRequest("Invalid 'from' offset".into()).into_response()
            }
        },
    };
    if session.lost(from) {
        return ServerError::BadRequest("Stream offset lost, please restart".into())
            .into_response();
    }
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(64);
    tokio::spawn(follow(session, from, tx));
    let mut resp = Body::from_stream(ReceiverStream::new(rx)).into_response();
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

/// Sends `session`'s bytes from offset `from` on to `tx` until the session ends, its reader
/// leaves or the bytes it would read next were dropped.
async fn follow(
    session: Arc<Session>,
    mut from: usize,
    tx: mpsc::Sender<Result<Bytes, Infallible>>,
) {
    let mut grown = session.grown.subscribe();
    loop {
        grown.borrow_and_update();
        let Ok((chunks, ended)) = session.read(from) else {
            return;
        };
        if chunks.is_empty() {
            if ended {
                return;
            }
            tokio::select! {
                _ = tx.closed() => return,
                r = grown.changed() => if r.is_err() { return },
            }
            continue;
        }
        for chunk in chunks {
            from += chunk.len();
            if tx.send(Ok(chunk)).await.is_err() {
                return;
            }
        }
    }
}

/// `DELETE /v1/stream?conv_id=ID`: stops the session's generation and forgets it; 204, as
/// llama-server answers, whether or not the tenant had such a session. 400 without an id.
pub(super) async fn stop(
    State(st): State<Arc<AppState>>,
    Extension(client): Extension<ClientKey>,
    Query(q): Query<StreamQuery>,
) -> Response {
    let Some(id) = q.conv_id.filter(|id| !id.is_empty()) else {
        return missing_id();
    };
    st.streams.stop(&(tenant(&st, &client), id));
    StatusCode::NO_CONTENT.into_response()
}

/// `POST /v1/streams/lookup` with `{"conversation_ids": [...]}`: the tenant's sessions for
/// those ids (an id also matches the sessions named `ID::MODEL`, as llama-server's router
/// names them), each `{conversation_id, is_done, total_bytes, started_at, completed_at}`.
/// Only ids the caller names are answered: sessions are never listed.
pub(super) async fn lookup(
    State(st): State<Arc<AppState>>,
    Extension(client): Extension<ClientKey>,
    super::RawBody(body): super::RawBody,
) -> Response {
    let body: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return ServerError::BadRequest(format!("invalid body: {e}")).into_response(),
    };
    let asked: Vec<&str> = body["conversation_ids"]
        .as_array()
        .map(|ids| {
            ids.iter()
                .filter_map(Value::as_str)
                .filter(|id| !id.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let owner = tenant(&st, &client);
    let map = st.streams.sessions();
    let mut found = Vec::new();
    for id in asked {
        let variant = format!("{id}::");
        for ((t, conv), s) in map.iter() {
            if *t == owner && (conv == id || conv.starts_with(&variant)) {
                found.push(s.info());
            }
        }
    }
    Json(Value::Array(found)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finished(id: &str, bytes: usize, ago: Duration) -> Arc<Session> {
        let s = Arc::new(Session::new(id.to_owned()));
        s.append(Bytes::from(vec![b'x'; bytes]));
        let at = Instant::now().checked_sub(ago).unwrap();
        lock(&s.log).ended = Some((at, 0));
        s
    }

    #[test]
    fn a_session_keeps_the_last_bytes_of_its_stream() {
        let s = Session::new("a".into());
        let chunk: Vec<u8> = (0..=255).collect();
        let n = SESSION_BYTES / chunk.len() + 10;
        for _ in 0..n {
            s.append(Bytes::from(chunk.clone()));
        }
        let total = n * chunk.len();
        let first = total - SESSION_BYTES;
        assert!(s.lost(first - 1));
        assert!(!s.lost(first));
        let (kept, ended) = s.read(first).ok().unwrap();
        assert!(!ended);
        let kept: Vec<u8> = kept.concat();
        assert_eq!(kept.len(), SESSION_BYTES);
        assert!(kept
            .iter()
            .enumerate()
            .all(|(i, &b)| b == ((first + i) % 256) as u8));
        let (tail, _) = s.read(total - 3).ok().unwrap();
        assert_eq!(tail.concat(), [253, 254, 255]);
        s.finish();
        s.append(Bytes::from_static(b"late"));
        assert_eq!(s.info()["total_bytes"], total);
    }

    #[test]
    fn finished_sessions_go_by_age_count_and_bytes_and_live_ones_stay() {
        let mut map = HashMap::new();
        let live = Arc::new(Session::new("live".into()));
        map.insert((None, "live".to_owned()), Arc::clone(&live));
        map.insert((None, "old".to_owned()), finished("old", 1, KEEP_FINISHED));
        for i in 0..MAX_SESSIONS + 4 {
            let ago = Duration::from_secs(100) - Duration::from_millis(i as u64);
            map.insert((None, format!("s{i}")), finished("s", 1, ago));
        }
        prune(&mut map);
        assert_eq!(map.len(), MAX_SESSIONS);
        assert!(!map.contains_key(&(None, "old".to_owned())));
        assert!(map.contains_key(&(None, "live".to_owned())));
        // The earliest finished went first.
        assert!(!map.contains_key(&(None, "s4".to_owned())));
        assert!(map.contains_key(&(None, "s5".to_owned())));

        let mut map = HashMap::new();
        for i in 0..20 {
            let ago = Duration::from_secs(100 - i);
            map.insert((None, format!("b{i}")), finished("b", 4 << 20, ago));
        }
        prune(&mut map);
        assert_eq!(map.len(), TOTAL_BYTES / (4 << 20));
        assert!(map.contains_key(&(None, "b19".to_owned())));
    }
}
