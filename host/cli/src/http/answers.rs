//! A POST's event stream written in one piece when its answer comes soon.
//!
//! rmcp answers each POST of a session with an event stream: the response's head at once,
//! then a priming event (an event id with no data, for a client whose connection drops to
//! resume with), then the messages. Written as each is ready, a call that ends within
//! microseconds cost three writes on the connection and three wake-ups of the client. The
//! head and the priming event are held here until the stream carries a message, at most
//! [`HOLD`]: a quick call's whole answer (head, priming event, message, end) then leaves
//! in one write. A longer call's client gets the head and the priming event after
//! [`HOLD`], and each later event as soon as it is ready; nothing is held once a message
//! has gone.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use http::header;
use http_body_util::BodyExt as _;
use hyper::body::Frame;

/// The longest a POST's answer waits for its first message before its head and priming
/// event are written alone.
pub(super) const HOLD: Duration = Duration::from_millis(5);

/// Holds a POST's event stream until it carries a message or [`HOLD`] has passed (see the
/// module's documentation); any other answer passes as it is.
pub(super) async fn whole_when_quick(request: Request, next: Next) -> Response {
    let post = request.method() == http::Method::POST;
    let response = next.run(request).await;
    if !post || !is_event_stream(&response) {
        return response;
    }
    let (parts, body) = response.into_parts();
    Response::from_parts(parts, Body::new(hold(body, HOLD).await))
}

fn is_event_stream(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("text/event-stream"))
        })
}

/// Reads `body`'s frames until one carries a message, the body ends or fails, or `hold`
/// has passed; what was read is written first.
async fn hold(mut body: Body, hold: Duration) -> Held {
    let mut read = VecDeque::new();
    let mut ended = false;
    let deadline = tokio::time::sleep(hold);
    tokio::pin!(deadline);
    loop {
        let frame = tokio::select! {
            biased;
            frame = body.frame() => frame,
            () = &mut deadline => break,
        };
        match frame {
            None => {
                ended = true;
                break;
            }
            Some(Ok(frame)) => {
                let message = frame.data_ref().is_some_and(|d| carries_message(d));
                read.push_back(Ok(frame));
                if message {
                    break;
                }
            }
            Some(Err(e)) => {
                read.push_back(Err(e));
                break;
            }
        }
    }
    Held {
        read,
        ended,
        rest: body,
    }
}

/// Whether an event of the stream carries a message: a `data` field that is not empty
/// (the priming event's is; a comment, such as a keep-alive, has none).
fn carries_message(event: &[u8]) -> bool {
    let mut starts = std::iter::once(0).chain(memchr::memchr_iter(b'\n', event).map(|i| i + 1));
    starts.any(|start| {
        event[start..].strip_prefix(b"data:").is_some_and(|value| {
            let value = value.strip_prefix(b" ").unwrap_or(value);
            !matches!(value.first(), None | Some(b'\n' | b'\r'))
        })
    })
}

/// A body whose first frames were read already.
struct Held {
    read: VecDeque<Result<Frame<Bytes>, axum::Error>>,
    /// The body ended while its frames were read.
    ended: bool,
    rest: Body,
}

impl hyper::body::Body for Held {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if let Some(frame) = self.read.pop_front() {
            return Poll::Ready(Some(frame));
        }
        if self.ended {
            return Poll::Ready(None);
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_empty() && (self.ended || self.rest.is_end_stream())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    #[test]
    fn an_event_carries_a_message_when_its_data_is_not_empty() {
        assert!(carries_message(b"data: {\"jsonrpc\":\"2.0\"}\nid: 0/3\n\n"));
        assert!(carries_message(b"id: 0/3\ndata: {}\n\n"));
        assert!(carries_message(b"data:{}\n\n"));
        assert!(!carries_message(b"data: \nid: 0/2\nretry: 3000\n\n"));
        assert!(!carries_message(b"data:\nid: 0/2\n\n"));
        assert!(!carries_message(b"data: \r\nid: 0/2\r\n\r\n"));
        assert!(!carries_message(b": keep-alive\n\n"));
        assert!(!carries_message(b": data: {}\n\n"));
        assert!(!carries_message(b"retry: 3000\n\n"));
        assert!(!carries_message(b""));
    }

    type Sender = http_body_util::channel::Sender<Bytes, axum::Error>;

    /// A body whose frames the test sends.
    fn script() -> (Sender, Body) {
        let (tx, body) = http_body_util::Channel::new(8);
        (tx, Body::new(body))
    }

    const PRIMING: &[u8] = b"data: \nid: 0/1\nretry: 3000\n\n";
    const MESSAGE: &[u8] = b"data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\nid: 0/1\n\n";

    fn event(bytes: &'static [u8]) -> Frame<Bytes> {
        Frame::data(Bytes::from_static(bytes))
    }

    fn data(read: &VecDeque<Result<Frame<Bytes>, axum::Error>>) -> Vec<&[u8]> {
        read.iter()
            .map(|f| f.as_ref().unwrap().data_ref().unwrap().as_ref())
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_quick_answer_is_held_until_its_message_and_then_written_whole() {
        let (mut tx, body) = script();
        tx.try_send(event(PRIMING)).unwrap();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            tx.try_send(event(MESSAGE)).unwrap();
        });
        let start = Instant::now();
        let held = hold(body, HOLD).await;
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(1),
            "held past the message"
        );
        assert_eq!(data(&held.read), [PRIMING, MESSAGE]);
        let all = held.collect().await.unwrap().to_bytes();
        assert_eq!(all, [PRIMING, MESSAGE].concat());
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_answer_gets_its_priming_event_after_the_hold_and_its_message_as_it_comes() {
        let (mut tx, body) = script();
        tx.try_send(event(PRIMING)).unwrap();
        let start = Instant::now();
        let mut held = hold(body, HOLD).await;
        assert_eq!(start.elapsed(), HOLD);
        assert_eq!(data(&held.read), [PRIMING]);
        let first = held.frame().await.unwrap().unwrap();
        assert_eq!(first.data_ref().unwrap().as_ref(), PRIMING);
        tx.try_send(event(MESSAGE)).unwrap();
        let next = held.frame().await.unwrap().unwrap();
        assert_eq!(next.data_ref().unwrap().as_ref(), MESSAGE);
        drop(tx);
        assert!(held.frame().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_ends_or_fails_while_held_is_passed_on_as_it_was() {
        let (mut tx, body) = script();
        tx.try_send(event(PRIMING)).unwrap();
        drop(tx);
        let held = hold(body, HOLD).await;
        assert!(held.ended && !hyper::body::Body::is_end_stream(&held));
        assert_eq!(held.collect().await.unwrap().to_bytes(), PRIMING);

        let (mut tx, body) = script();
        tx.try_send(event(PRIMING)).unwrap();
        tx.abort(axum::Error::new("the stream broke"));
        let mut held = hold(body, HOLD).await;
        assert!(held.frame().await.unwrap().is_ok());
        let failed = held.frame().await.unwrap().unwrap_err();
        assert_eq!(failed.to_string(), "the stream broke");
    }

    /// The time until `method`'s answer (an event stream, or JSON) is handed on, through
    /// the middleware, when its body's message never comes.
    async fn answered_after(method: http::Method, content_type: &'static str) -> Duration {
        use tower::ServiceExt as _;
        let respond = move || async move {
            let (mut tx, body) = script();
            tx.try_send(event(PRIMING)).unwrap();
            // Keeps the body open: no message, no end.
            std::mem::forget(tx);
            Response::builder()
                .header(header::CONTENT_TYPE, content_type)
                .body(body)
                .unwrap()
        };
        let app = axum::Router::new()
            .route("/", axum::routing::any(respond))
            .layer(axum::middleware::from_fn(whole_when_quick));
        let request = http::Request::builder()
            .method(method)
            .uri("/")
            .body(Body::empty())
            .unwrap();
        let start = Instant::now();
        let response = app.oneshot(request).await.unwrap();
        assert_eq!(response.status(), http::StatusCode::OK);
        start.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_posts_event_stream_is_held() {
        let event_stream = "text/event-stream";
        assert_eq!(answered_after(http::Method::POST, event_stream).await, HOLD);
        let zero = Duration::ZERO;
        assert_eq!(answered_after(http::Method::GET, event_stream).await, zero);
        assert_eq!(
            answered_after(http::Method::POST, "application/json").await,
            zero
        );
        assert_eq!(
            answered_after(http::Method::POST, "Text/Event-Stream; charset=utf-8").await,
            HOLD
        );
    }
}
