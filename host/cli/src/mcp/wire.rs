//! The stdio transport: one JSON-RPC message per line each way, like rmcp's own, with a
//! shorter way in for the request every tool call makes.
//!
//! rmcp parses a request by trying each request type of the protocol in turn until one
//! accepts it; a `tools/call` is the fourteenth, so every call paid for thirteen failed
//! parses (each building an error message). A line whose keys make it a `tools/call`
//! request is parsed straight as one; every other line, and one the short way cannot
//! parse, goes through rmcp's own codec, so what a client sees (which messages are ignored,
//! which get an `Invalid Request` answer) stays rmcp's. A response is written in one
//! piece, encoded before the writer is taken; the long texts of a tool's result are
//! escaped apart, with SIMD instructions (see [`encode`]).

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;

use rmcp::model::{
    CallToolRequest, ClientRequest, ContentBlock, ErrorData, JsonRpcMessage, JsonRpcRequest,
    JsonRpcResponse, ServerResult,
};
use rmcp::service::{RoleServer, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::async_rw::{JsonRpcMessageCodec, JsonRpcMessageCodecError};
use rmcp::transport::Transport;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio_util::bytes::BytesMut;
use tokio_util::codec::Decoder;

/// The longest line read (rmcp's limit); a longer one is skipped whole.
const MAX_LINE: usize = 16 * 1024 * 1024;

/// The most line buffer kept between messages; a longer message's is given back.
const KEPT_LINE_CAPACITY: usize = 1024 * 1024;

/// A UTF-8 byte order mark, which JSON parsers may ignore (RFC 8259 §8.1).
const BOM: &[u8] = b"\xEF\xBB\xBF";

pub(super) struct Wire<R, W> {
    read: BufReader<R>,
    /// The line being read. A read cancelled halfway (`receive` is polled in a `select!`)
    /// leaves its bytes here, and the next one goes on with the same line.
    line: Vec<u8>,
    /// Skipping the rest of a line longer than [`MAX_LINE`].
    discarding: bool,
    /// `None` once closed.
    write: Arc<tokio::sync::Mutex<Option<W>>>,
    /// The `Invalid Request` answer being written: the next line is read once it is out,
    /// so a client that sends such lines without reading gets no more than one queued.
    answering: Option<tokio::task::JoinHandle<()>>,
}

/// What reading a line gave.
enum Read {
    Line,
    Oversized,
    End,
}

impl<R, W> Wire<R, W>
where
    R: AsyncRead + Send + Unpin,
    W: AsyncWrite + Send + Unpin + 'static,
{
    pub(super) fn new(read: R, write: W) -> Self {
        Wire {
            read: BufReader::new(read),
            line: Vec::new(),
            discarding: false,
            write: Arc::new(tokio::sync::Mutex::new(Some(write))),
            answering: None,
        }
    }

    /// Reads up to the end of a line into `self.line` (kept across a cancelled read).
    async fn read_line(&mut self) -> Read {
        loop {
            let available = match self.read.fill_buf().await {
                Ok([]) => return Read::End,
                Ok(available) => available,
                Err(e) => {
                    tracing::error!("cannot read the MCP input: {e}");
                    return Read::End;
                }
            };
            let newline = available.iter().position(|b| *b == b'\n');
            let take = newline.map_or(available.len(), |i| i + 1);
            let read = if self.discarding {
                self.discarding = newline.is_none();
                None
            } else if self.line.len().saturating_add(take) > MAX_LINE {
                // Nearly `MAX_LINE` held: given back, not kept for the next line.
                self.line = Vec::new();
                self.discarding = newline.is_none();
                Some(Read::Oversized)
            } else {
                self.line.extend_from_slice(&available[..take]);
                newline.map(|_| Read::Line)
            };
            self.read.consume(take);
            if let Some(read) = read {
                return read;
            }
        }
    }
}

impl<R, W> Transport<RoleServer> for Wire<R, W>
where
    R: AsyncRead + Send + Unpin,
    W: AsyncWrite + Send + Unpin + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let encoded = encode(item);
        let write = self.write.clone();
        async move { write_line(&write, encoded?).await }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            if let Some(answering) = &mut self.answering {
                // Awaited by reference: a cancelled wait leaves the handle for the next.
                let _ = answering.await;
                self.answering = None;
            }
            match self.read_line().await {
                Read::Line => {}
                Read::Oversized => {
                    tracing::error!(
                        max_line_length = MAX_LINE,
                        "an MCP message exceeded the maximum line length; skipping it"
                    );
                    continue;
                }
                // Bytes after the last newline are an unfinished message: nothing to serve.
                Read::End => return None,
            }
            let parsed = parse(&self.line);
            if self.line.capacity() > KEPT_LINE_CAPACITY {
                // A long message's buffer is not kept for the connection's life.
                self.line = Vec::new();
            } else {
                self.line.clear();
            }
            match parsed {
                Parsed::Message(message) => return Some(*message),
                Parsed::Skipped => {}
                Parsed::InvalidRequest => {
                    // Sent like a response, by a task of its own: a write cut off halfway
                    // (`receive` is polled in a `select!`) would garble the next line.
                    let answer = TxJsonRpcMessage::<RoleServer>::error(
                        ErrorData::invalid_request("Invalid request", None),
                        None,
                    );
                    let send = self.send(answer);
                    self.answering = Some(tokio::spawn(async move {
                        if let Err(e) = send.await {
                            tracing::error!("cannot answer an invalid MCP request: {e}");
                        }
                    }));
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        drop(self.write.lock().await.take());
        Ok(())
    }
}

/// A text of a tool's result at least this long is escaped apart; a shorter one by serde.
const LONG_TEXT: usize = 64;

/// A text longer than this is serde's too: the SIMD escaper reserves six times a text's
/// length while it writes, which for a text this long outweighs what it saves.
const LONGEST_APART: usize = 1024 * 1024;

/// What a long text is while the rest of its message is serialized: a string no tool's
/// text is (a text of this length is not taken apart), and what serde makes of it.
const STAND_IN: &str = "\0cordis-text\0";
const STAND_IN_JSON: &[u8] = br#""\u0000cordis-text\u0000""#;

/// One message as a line: serde's JSON, byte for byte. The long texts of a tool's result
/// (a page of a file, a command's output) are escaped with SIMD instructions
/// (`json_escape_simd`, the same JSON): serde's escaping looks at one byte at a time, and
/// was a quarter of the host's instructions for a 4 KiB `read`. Each text stands in as
/// [`STAND_IN`] while serde writes the rest, then takes its place; a message whose JSON
/// holds the stand-in anywhere else is written by serde whole.
fn encode(mut message: TxJsonRpcMessage<RoleServer>) -> std::io::Result<Vec<u8>> {
    let texts = take_long_texts(&mut message);
    let mut line = serde_json::to_vec(&message)?;
    if !texts.is_empty() {
        match splice(&line, &texts) {
            Some(spliced) => line = spliced,
            None => {
                put_back(&mut message, texts);
                line = serde_json::to_vec(&message)?;
            }
        }
    }
    line.push(b'\n');
    Ok(line)
}

/// The result of a `tools/call`, when `message` answers one.
fn tool_result(
    message: &mut TxJsonRpcMessage<RoleServer>,
) -> Option<&mut rmcp::model::CallToolResult> {
    match message {
        JsonRpcMessage::Response(JsonRpcResponse {
            result: ServerResult::CallToolResult(result),
            ..
        }) => Some(result),
        _ => None,
    }
}

/// The blocks of a tool's result whose text is long, by index, each text taken out and
/// [`STAND_IN`] left in its place.
fn take_long_texts(message: &mut TxJsonRpcMessage<RoleServer>) -> Vec<(usize, String)> {
    let Some(result) = tool_result(message) else {
        return Vec::new();
    };
    let mut texts = Vec::new();
    for (i, block) in result.content.iter_mut().enumerate() {
        if let ContentBlock::Text(t) = block {
            if (LONG_TEXT..=LONGEST_APART).contains(&t.text.len()) {
                texts.push((i, std::mem::replace(&mut t.text, STAND_IN.to_string())));
            }
        }
    }
    texts
}

/// The texts [`take_long_texts`] took, back in their blocks.
fn put_back(message: &mut TxJsonRpcMessage<RoleServer>, texts: Vec<(usize, String)>) {
    let Some(result) = tool_result(message) else {
        return;
    };
    for (i, text) in texts {
        if let Some(ContentBlock::Text(t)) = result.content.get_mut(i) {
            t.text = text;
        }
    }
}

/// `json` with each [`STAND_IN_JSON`] replaced by its text, escaped, in order; `None` when
/// the stand-in occurs other than once per text (another string of the message holds it).
fn splice(json: &[u8], texts: &[(usize, String)]) -> Option<Vec<u8>> {
    static FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(STAND_IN_JSON));
    let at: Vec<usize> = FINDER.find_iter(json).collect();
    if at.len() != texts.len() {
        return None;
    }
    let longest = texts.iter().map(|(_, t)| t.len()).max().unwrap_or(0);
    // Room for the texts as they are, and for the escaper's scratch past the longest.
    let room = texts.iter().map(|(_, t)| t.len() + 2).sum::<usize>() + longest * 5 + 35;
    let mut line = Vec::with_capacity(json.len() + room);
    let mut from = 0;
    for (&i, (_, text)) in at.iter().zip(texts) {
        line.extend_from_slice(&json[from..i]);
        json_escape_simd::escape_into(text, &mut line);
        from = i + STAND_IN_JSON.len();
    }
    line.extend_from_slice(&json[from..]);
    Some(line)
}

async fn write_line<W: AsyncWrite + Unpin>(
    write: &tokio::sync::Mutex<Option<W>>,
    line: Vec<u8>,
) -> std::io::Result<()> {
    let mut write = write.lock().await;
    let write = write.as_mut().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::NotConnected, "the transport is closed")
    })?;
    write.write_all(&line).await?;
    write.flush().await
}

/// What a line of input is.
enum Parsed {
    Message(Box<RxJsonRpcMessage<RoleServer>>),
    /// Nothing to answer: not JSON (answering could start an error storm with a peer that
    /// echoes), an empty line, or a notification rmcp ignores for compatibility.
    Skipped,
    /// JSON of no message's shape: answered `Invalid Request`.
    InvalidRequest,
}

/// Parses one line (its newline included or not).
fn parse(line: &[u8]) -> Parsed {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.is_empty() {
        return Parsed::Skipped;
    }
    if let Some(call) = tools_call(line) {
        return Parsed::Message(Box::new(call));
    }
    let mut framed = BytesMut::with_capacity(line.len() + 1);
    framed.extend_from_slice(line);
    framed.extend_from_slice(b"\n");
    match JsonRpcMessageCodec::<RxJsonRpcMessage<RoleServer>>::default().decode(&mut framed) {
        Ok(Some(message)) => Parsed::Message(Box::new(message)),
        Ok(None) => Parsed::Skipped,
        Err(JsonRpcMessageCodecError::Serde(e)) => match e.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                tracing::debug!("ignoring an MCP message that is not JSON: {e}");
                Parsed::Skipped
            }
            serde_json::error::Category::Data | serde_json::error::Category::Io => {
                tracing::debug!("an MCP message of no known shape: {e}");
                Parsed::InvalidRequest
            }
        },
        Err(e) => {
            tracing::debug!("ignoring an MCP message: {e}");
            Parsed::Skipped
        }
    }
}

/// `line` as a `tools/call` request when its keys make it one (a `method` of `tools/call`,
/// an `id`, no `result` or `error`: rmcp's test of a request) and it parses as one;
/// `None` sends it the general way.
fn tools_call(line: &[u8]) -> Option<RxJsonRpcMessage<RoleServer>> {
    let line = line.strip_prefix(BOM).unwrap_or(line);
    let keys: Keys = serde_json::from_slice(line).ok()?;
    if keys.method.as_deref() != Some("tools/call") || !keys.id || keys.result || keys.error {
        return None;
    }
    let request: JsonRpcRequest<CallToolRequest> = serde_json::from_slice(line).ok()?;
    Some(JsonRpcMessage::Request(JsonRpcRequest {
        jsonrpc: request.jsonrpc,
        id: request.id,
        request: ClientRequest::CallToolRequest(request.request),
    }))
}

/// Which of a message's keys decide its shape, and its method.
#[derive(Default)]
struct Keys<'a> {
    method: Option<Cow<'a, str>>,
    id: bool,
    result: bool,
    error: bool,
}

impl<'de> serde::Deserialize<'de> for Keys<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Keys<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON-RPC message")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Keys<'de>, A::Error> {
                let mut keys = Keys::default();
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    match &*key {
                        "method" => {
                            // A second `method` is the general parse's to judge.
                            if keys.method.is_some() {
                                return Err(serde::de::Error::duplicate_field("method"));
                            }
                            keys.method = Some(map.next_value::<Cow<'de, str>>()?);
                            continue;
                        }
                        "id" => keys.id = true,
                        "result" => keys.result = true,
                        "error" => keys.error = true,
                        _ => {}
                    }
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
                Ok(keys)
            }
        }
        deserializer.deserialize_map(Visit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What rmcp's own codec makes of `line`.
    fn rmcp_parse(line: &str) -> Option<String> {
        let mut framed = BytesMut::from(format!("{line}\n").as_bytes());
        JsonRpcMessageCodec::<RxJsonRpcMessage<RoleServer>>::default()
            .decode(&mut framed)
            .ok()
            .flatten()
            .map(|m| serde_json::to_string(&m).expect("serialize"))
    }

    #[test]
    fn a_tools_call_parses_the_short_way_into_what_rmcp_makes_of_it() {
        let lines = [
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"read","arguments":{"path":"a.txt","offset":3}}}"#,
            r#"{"method":"tools/call","params":{"name":"bash","arguments":{"command":"ls"},"_meta":{"progressToken":"p1"}},"id":"x","jsonrpc":"2.0"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"write","arguments":{"path":"\u00e9\n","content":"a\"b"},"requestState":"s"}}"#,
            "\u{feff}{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{\"name\":\"list\"}}",
        ];
        for line in lines {
            let short = tools_call(line.as_bytes())
                .unwrap_or_else(|| panic!("not parsed the short way: {line}"));
            let short = serde_json::to_string(&short).expect("serialize");
            assert_eq!(Some(short.clone()), rmcp_parse(line), "{line}");
            match parse(line.as_bytes()) {
                Parsed::Message(m) => {
                    assert_eq!(serde_json::to_string(&m).expect("serialize"), short)
                }
                _ => panic!("not a message: {line}"),
            }
        }
    }

    #[test]
    fn anything_but_a_well_formed_tools_call_goes_the_general_way() {
        let general = [
            // Other requests and notifications.
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            // Shapes that are not a request: no id, or a result or error beside it.
            r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"read"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read"},"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read"},"error":{}}"#,
            // Bad params, a duplicate method, a non-string method, not JSON at all.
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":7}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","method":"ping","params":{"name":"a"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":["tools/call"]}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"}} trailing"#,
            "not json",
        ];
        for line in general {
            assert!(tools_call(line.as_bytes()).is_none(), "{line}");
        }
        // What the general way makes of them is rmcp's.
        for line in general {
            match (parse(line.as_bytes()), rmcp_parse(line)) {
                (Parsed::Message(m), Some(theirs)) => {
                    assert_eq!(serde_json::to_string(&m).expect("serialize"), theirs)
                }
                (Parsed::Message(m), None) => panic!("rmcp refuses `{line}`, parsed as {m:?}"),
                (_, Some(theirs)) => panic!("rmcp parses `{line}` as {theirs}"),
                (_, None) => {}
            }
        }
        assert!(matches!(parse(general[0].as_bytes()), Parsed::Message(_)));
        assert!(matches!(
            parse(general[3].as_bytes()),
            Parsed::InvalidRequest
        ));
        assert!(matches!(parse(b"not json"), Parsed::Skipped));
        assert!(matches!(parse(b"\r\n"), Parsed::Skipped));
    }

    /// A `tools/call` response of `content`, as a handler gives it to the transport.
    fn response(result: rmcp::model::CallToolResult) -> TxJsonRpcMessage<RoleServer> {
        JsonRpcMessage::response(
            ServerResult::CallToolResult(result),
            rmcp::model::RequestId::Number(7),
        )
    }

    /// Whether [`encode`] took `message`'s long texts apart and put them back in place.
    fn spliced(message: &TxJsonRpcMessage<RoleServer>) -> bool {
        let mut taken = message.clone();
        let texts = take_long_texts(&mut taken);
        !texts.is_empty()
            && splice(&serde_json::to_vec(&taken).expect("serialize"), &texts).is_some()
    }

    #[test]
    fn a_response_is_serdes_json_byte_for_byte_its_long_texts_escaped_apart() {
        use rmcp::model::CallToolResult;
        let page = "0123456789abcdef\n".repeat(256);
        let every_ascii: String = (0u8..0x80).map(char::from).collect();
        let mixed = "tab\t, \"quote\", back\\slash, é, 日本語, \u{1F600}, \u{7f}\r\n".repeat(9);
        let at_the_edge = "x".repeat(LONG_TEXT - 1);
        let just_long = "\"".repeat(LONG_TEXT);
        // A long text holding the stand-in is a text like any other.
        let holds_it = format!("{STAND_IN}{}{STAND_IN}", "y".repeat(LONG_TEXT));
        let text = |t: &str| ContentBlock::text(t.to_string());
        let mut with_everything = CallToolResult::error(vec![
            text(&page),
            text("short"),
            ContentBlock::image("aGk=", "image/png"),
            text(&mixed),
        ]);
        with_everything.structured_content = Some(serde_json::json!({"lines": 256, "note": "é"}));
        let mut meta = serde_json::Map::new();
        meta.insert("k".into(), serde_json::json!("v"));
        with_everything.meta = Some(rmcp::model::MetaObject(meta));
        let spliced_cases = [
            CallToolResult::success(vec![text(&page)]),
            CallToolResult::success(vec![text(&every_ascii.repeat(3))]),
            CallToolResult::success(vec![text(&just_long), text(&at_the_edge), text(&page)]),
            CallToolResult::success(vec![text(&holds_it)]),
            CallToolResult::success(vec![text(&"z\n".repeat(LONGEST_APART / 2))]),
            with_everything,
        ];
        // The stand-in elsewhere in the message: serde writes it whole.
        let mut elsewhere = CallToolResult::success(vec![text(&page)]);
        elsewhere.structured_content = Some(serde_json::json!({ "s": STAND_IN }));
        let whole_cases = [
            elsewhere,
            // A short text that is the stand-in is serde's, so the message is too.
            CallToolResult::success(vec![text(&holds_it), text(STAND_IN)]),
            CallToolResult::success(vec![text(&at_the_edge)]),
            CallToolResult::success(vec![text(&"z\n".repeat(LONGEST_APART / 2 + 1))]),
            CallToolResult::success(vec![]),
        ];
        for (result, fast) in spliced_cases
            .into_iter()
            .map(|r| (r, true))
            .chain(whole_cases.into_iter().map(|r| (r, false)))
        {
            let message = response(result);
            let mut serde = serde_json::to_vec(&message).expect("serialize");
            serde.push(b'\n');
            assert_eq!(spliced(&message), fast, "{message:?}");
            let ours = encode(message.clone()).expect("encode");
            assert!(
                ours == serde,
                "{message:?}\nours:  {}\nserde: {}",
                String::from_utf8_lossy(&ours),
                String::from_utf8_lossy(&serde)
            );
        }
        // Other messages are serde's as they are.
        let ping = TxJsonRpcMessage::<RoleServer>::response(
            ServerResult::empty(()),
            rmcp::model::RequestId::Number(1),
        );
        let mut serde = serde_json::to_vec(&ping).expect("serialize");
        serde.push(b'\n');
        assert_eq!(encode(ping).expect("encode"), serde);
    }

    #[tokio::test]
    async fn lines_are_read_whole_and_an_oversized_one_is_skipped() {
        let call = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"read"}}"#;
        let mut input = String::from("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\r\n\n");
        input.push_str(&"x".repeat(MAX_LINE + 10));
        input.push('\n');
        input.push_str(call);
        input.push('\n');
        input.push_str(r#"{"jsonrpc":"2.0","id":9,"me"#);
        let (ours, mut theirs) = tokio::io::duplex(64 * 1024);
        let writer = tokio::spawn(async move {
            theirs.write_all(input.as_bytes()).await.unwrap();
            theirs
        });
        let mut wire = Wire::new(ours, tokio::io::sink());
        let first = wire.receive().await.expect("the ping");
        assert!(format!("{first:?}").contains("PingRequest"), "{first:?}");
        let second = wire.receive().await.expect("the call after the long line");
        assert!(
            format!("{second:?}").contains("CallToolRequest"),
            "{second:?}"
        );
        drop(writer.await.unwrap());
        assert!(
            wire.receive().await.is_none(),
            "an unfinished line is served"
        );
    }

    #[tokio::test]
    async fn a_message_of_no_known_shape_is_answered_invalid_request_whole() {
        use tokio::io::AsyncReadExt;
        let input = concat!(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"},"result":{}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#,
            "\n",
        );
        let (ours, mut theirs) = tokio::io::duplex(64 * 1024);
        let (out, mut answers) = tokio::io::duplex(64 * 1024);
        theirs.write_all(input.as_bytes()).await.unwrap();
        let mut wire = Wire::new(ours, out);
        let ping = wire
            .receive()
            .await
            .expect("the ping after the invalid line");
        assert!(format!("{ping:?}").contains("PingRequest"), "{ping:?}");
        wire.close().await.unwrap();
        drop(wire);
        let mut written = String::new();
        answers.read_to_string(&mut written).await.unwrap();
        let lines: Vec<&str> = written.lines().collect();
        assert_eq!(lines.len(), 1, "{written:?}");
        let answer: serde_json::Value = serde_json::from_str(lines[0]).expect("one JSON line");
        assert_eq!(answer["error"]["code"], -32600, "{answer}");
        assert_eq!(answer["id"], serde_json::Value::Null, "{answer}");
    }
}
