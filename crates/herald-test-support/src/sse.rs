//! A Server-Sent Events reader for `GET /sse`, parsing the stream as a
//! browser's `EventSource` does (`event`, `id`, `data` lines, comments),
//! with every read bounded.

use std::time::Duration;

use serde_json::Value;

use crate::WAIT;

/// One event of a stream.
#[derive(Debug, Clone, PartialEq)]
pub struct SseEvent {
    /// `None`: the default type (`message`).
    pub event: Option<String>,
    /// The id field, if the event had one.
    pub id: Option<String>,
    pub data: String,
}

impl SseEvent {
    /// The data as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data).expect("event data is JSON")
    }

    /// Whether it is an app message (the default event type).
    pub fn is_message(&self) -> bool {
        self.event.is_none()
    }
}

/// What a stream's opening request got: a stream, or a refusal with its
/// status and problem document.
pub enum SseOpen {
    Stream(Box<SseStream>),
    Refused { status: u16, body: Value },
}

impl SseOpen {
    pub fn stream(self) -> SseStream {
        match self {
            SseOpen::Stream(s) => *s,
            SseOpen::Refused { status, body } => panic!("stream refused: {status} {body}"),
        }
    }

    pub fn refused(self) -> (u16, Value) {
        match self {
            SseOpen::Stream(_) => panic!("the stream was opened"),
            SseOpen::Refused { status, body } => (status, body),
        }
    }
}

/// An open stream.
pub struct SseStream {
    resp: reqwest::Response,
    buf: Vec<u8>,
    /// The last id seen, as `EventSource.lastEventId` keeps it.
    pub last_id: Option<String>,
    /// The `retry:` the stream set, in ms.
    pub retry_ms: Option<u64>,
    /// Comment lines seen (the server's pings).
    pub comments: usize,
    pub headers: reqwest::header::HeaderMap,
    pub version: reqwest::Version,
}

impl SseStream {
    /// `GET url` with `Last-Event-ID` if given.
    pub async fn open(client: &reqwest::Client, url: &str, last_event_id: Option<&str>) -> SseOpen {
        let mut req = client.get(url);
        if let Some(id) = last_event_id {
            req = req.header("Last-Event-ID", id);
        }
        let resp =
            tokio::time::timeout(WAIT, req.send()).await.expect("stream answered in time").expect("GET");
        let status = resp.status().as_u16();
        if status != 200 {
            let body = resp.json().await.unwrap_or(Value::Null);
            return SseOpen::Refused { status, body };
        }
        let headers = resp.headers().clone();
        let version = resp.version();
        SseOpen::Stream(Box::new(SseStream {
            resp,
            buf: Vec::new(),
            last_id: None,
            retry_ms: None,
            comments: 0,
            headers,
            version,
        }))
    }

    /// The next event; `None` once the stream ended. Panics after [`WAIT`].
    pub async fn next(&mut self) -> Option<SseEvent> {
        self.next_within(WAIT).await.expect("an event or the end in time")
    }

    /// The next event within `d` (`Err` on the deadline); `Ok(None)` once
    /// the stream ended.
    pub async fn next_within(
        &mut self,
        d: Duration,
    ) -> Result<Option<SseEvent>, tokio::time::error::Elapsed> {
        tokio::time::timeout(d, self.read_event()).await
    }

    async fn read_event(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(end) = find_blank_line(&self.buf) {
                let block: Vec<u8> = self.buf.drain(..end.1).collect();
                if let Some(ev) = self.parse(&block[..end.0]) {
                    return Some(ev);
                }
                continue;
            }
            match self.resp.chunk().await {
                Ok(Some(chunk)) => self.buf.extend_from_slice(&chunk),
                Ok(None) | Err(_) => return None,
            }
        }
    }

    fn parse(&mut self, block: &[u8]) -> Option<SseEvent> {
        let text = std::str::from_utf8(block).expect("the stream is UTF-8");
        let (mut event, mut id, mut data, mut has_data) = (None, None, String::new(), false);
        for line in text.split('\n') {
            if line.starts_with(':') {
                self.comments += 1;
                continue;
            }
            let (field, value) =
                line.split_once(':').map_or((line, ""), |(f, v)| (f, v.strip_prefix(' ').unwrap_or(v)));
            match field {
                "event" => event = Some(value.to_owned()),
                "id" => id = Some(value.to_owned()),
                "retry" => self.retry_ms = value.parse().ok(),
                "data" => {
                    if has_data {
                        data.push('\n');
                    }
                    data.push_str(value);
                    has_data = true;
                }
                _ => {}
            }
        }
        if id.is_some() {
            self.last_id.clone_from(&id);
        }
        has_data.then_some(SseEvent { event, id, data })
    }

    /// Read events until `n` app messages came (other events skipped);
    /// panics if the stream ends first.
    pub async fn messages(&mut self, n: usize) -> Vec<Value> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            match self.next().await {
                Some(ev) if ev.is_message() => out.push(ev.json()),
                Some(_) => {}
                None => panic!("the stream ended after {} of {n} messages", out.len()),
            }
        }
        out
    }

    /// Read every event until the stream ends.
    pub async fn until_end(&mut self) -> Vec<SseEvent> {
        let mut out = Vec::new();
        while let Some(ev) = self.next().await {
            out.push(ev);
        }
        out
    }
}

/// The end of the first event block: (where its text ends, where the next
/// block starts).
fn find_blank_line(buf: &[u8]) -> Option<(usize, usize)> {
    buf.windows(2).position(|w| w == b"\n\n").map(|i| (i, i + 2))
}
