//! The network proxy of one confined command: how the allowlist (`network:` as a map) is
//! enforced.
//!
//! The command keeps its own network namespace, so it has no route out. Before the shell
//! starts, the supervisor opens a listening TCP socket on the namespace's loopback
//! ([`dsh_sandbox::egress::PROXY_PORT`]) and hands it to the backend over a unix socket
//! pair; the backend serves it here, in its own network namespace. The listening socket
//! is the command's one way out, and it leads only to this proxy, which:
//!
//! - speaks HTTP proxy: `CONNECT host:port` (tunnels, for TLS) and absolute-form plain
//!   HTTP (`GET http://host/…`, forwarded with `Connection: close`);
//! - decides by the rules ([`Rules::decide`]: deny wins, then allow, then a person's
//!   approval with `ask`), resolves the name itself ([`Resolver`]) and checks every
//!   address it resolved to ([`Rules::check_address`]) before connecting to exactly those
//!   addresses: a name that resolves to a denied or private address is refused after
//!   resolution, and a second answer (DNS rebinding) is never asked for;
//! - never follows a redirect (it forwards the response as it is);
//! - answers a refusal with `403` and a body naming the rule.
//!
//! Every decision is recorded ([`Connection`]) for the session log and logged at debug.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpStream, ToSocketAddrs, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dsh_sandbox::egress::{Connection, Host, Rules, Verdict, LIMITED_METHODS};

/// The longest request head the proxy reads (the request line and headers).
const MAX_HEAD: usize = 32 * 1024;
/// How long a client may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a connection to an allowed host may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the DNS server may take to answer one query (asked twice).
const DNS_TIMEOUT: Duration = Duration::from_secs(3);
/// The most connections one command may have open through the proxy at once.
const MAX_CONNECTIONS: usize = 256;
/// After this long waiting for the connections of a command that is over, the wait is
/// logged (it goes on: see [`Proxy::finish`]).
const DRAIN: Duration = Duration::from_secs(1);
/// The most decisions one command's record keeps (the rest are counted).
const MAX_RECORDS: usize = 1000;

/// Asks a person whether the command may reach an unlisted host (`ask`): called on a
/// proxy thread; returns the answer (or `false` when nobody can be asked).
pub(crate) type Asker = Box<dyn Fn(&str, u16) -> bool + Send + Sync>;

/// How the proxy finds the addresses of a name.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Resolver {
    /// The system's resolver (`getaddrinfo`: `/etc/hosts`, then DNS).
    System,
    /// This DNS server, over UDP.
    Server(SocketAddr),
}

impl Resolver {
    fn resolve(self, name: &str, port: u16) -> Result<Vec<IpAddr>, String> {
        match self {
            Resolver::System => (name, port)
                .to_socket_addrs()
                .map(|addrs| addrs.map(|a| a.ip()).collect())
                .map_err(|e| format!("cannot resolve `{name}`: {e}")),
            Resolver::Server(server) => ask_dns(server, name),
        }
    }
}

/// The A and AAAA records of `name` from `server`.
fn ask_dns(server: SocketAddr, name: &str) -> Result<Vec<IpAddr>, String> {
    use simple_dns::{
        rdata::RData, Name, Packet, PacketFlag, Question, CLASS, QCLASS, QTYPE, TYPE,
    };
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);
    let failed = |why: String| format!("cannot resolve `{name}` at {server}: {why}");
    let bind: SocketAddr = match server {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(bind).map_err(|e| failed(e.to_string()))?;
    socket.connect(server).map_err(|e| failed(e.to_string()))?;
    socket
        .set_read_timeout(Some(DNS_TIMEOUT))
        .map_err(|e| failed(e.to_string()))?;
    let qname = Name::new(name).map_err(|e| failed(e.to_string()))?;
    let mut found = Vec::new();
    for qtype in [TYPE::A, TYPE::AAAA] {
        let id = (NEXT_ID.fetch_add(1, Ordering::Relaxed) ^ std::process::id() as u64) as u16;
        let mut query = Packet::new_query(id);
        query.set_flags(PacketFlag::RECURSION_DESIRED);
        query.questions.push(Question::new(
            qname.clone(),
            QTYPE::TYPE(qtype),
            QCLASS::CLASS(CLASS::IN),
            false,
        ));
        let bytes = query.build_bytes_vec().map_err(|e| failed(e.to_string()))?;
        let mut buf = [0u8; 4096];
        let mut answer = None;
        'tries: for _ in 0..2 {
            socket.send(&bytes).map_err(|e| failed(e.to_string()))?;
            loop {
                match socket.recv(&mut buf) {
                    Ok(n) => match Packet::parse(&buf[..n]) {
                        // A stray answer (an earlier query's) is skipped.
                        Ok(p) if p.id() == id => {
                            answer = Some(n);
                            break 'tries;
                        }
                        _ => continue,
                    },
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        ) =>
                    {
                        continue 'tries
                    }
                    Err(e) => return Err(failed(e.to_string())),
                }
            }
        }
        let n = answer.ok_or_else(|| failed("no answer".to_string()))?;
        let packet = Packet::parse(&buf[..n]).map_err(|e| failed(e.to_string()))?;
        for record in &packet.answers {
            match &record.rdata {
                RData::A(a) => found.push(IpAddr::from(Ipv4Addr::from(a.address))),
                RData::AAAA(a) => found.push(IpAddr::from(std::net::Ipv6Addr::from(a.address))),
                _ => {}
            }
        }
    }
    if found.is_empty() {
        return Err(failed("the server knows no address for it".to_string()));
    }
    Ok(found)
}

/// What the proxy threads share.
struct Shared {
    rules: Rules,
    resolver: Resolver,
    asker: Option<Asker>,
    records: Mutex<Records>,
    /// The sockets of open connections (shut down when the command is over), and how many
    /// connection threads are running.
    live: Mutex<Live>,
    ended: Condvar,
}

#[derive(Default)]
struct Records {
    kept: Vec<Connection>,
    /// Decisions beyond [`MAX_RECORDS`], logged but not kept.
    more: u64,
}

#[derive(Default)]
struct Live {
    next: u64,
    sockets: Vec<(u64, TcpStream)>,
    threads: usize,
}

impl Shared {
    fn track(&self, stream: &TcpStream) -> Option<u64> {
        let clone = stream.try_clone().ok()?;
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.next += 1;
        let id = live.next;
        live.sockets.push((id, clone));
        Some(id)
    }

    fn untrack(&self, ids: &[u64]) {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.sockets.retain(|(id, _)| !ids.contains(id));
    }

    fn record(&self, connection: Connection) {
        tracing::debug!(
            host = %connection.host,
            port = connection.port,
            method = %connection.method,
            allowed = connection.allowed,
            rule = %connection.rule,
            sent = connection.sent,
            received = connection.received,
            millis = connection.millis,
            "network proxy decision"
        );
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        if records.kept.len() < MAX_RECORDS {
            records.kept.push(connection);
        } else {
            records.more += 1;
        }
    }
}

/// The proxy of one command, serving its listening socket until [`Proxy::finish`].
pub(crate) struct Proxy {
    shared: Arc<Shared>,
    /// Dropping the write end wakes the accept loop, which then returns.
    stop: Option<OwnedFd>,
    accept: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Serves `listener` (the command's loopback port) on a thread of its own.
    pub(crate) fn serve(
        listener: OwnedFd,
        rules: Rules,
        asker: Option<Asker>,
    ) -> io::Result<Proxy> {
        let resolver = match rules.resolver {
            Some(server) => Resolver::Server(server),
            None => Resolver::System,
        };
        let shared = Arc::new(Shared {
            rules,
            resolver,
            asker,
            records: Mutex::new(Records::default()),
            live: Mutex::new(Live::default()),
            ended: Condvar::new(),
        });
        let (stop_rd, stop_wr) = crate::run::pipe()?;
        let serving = shared.clone();
        let accept = std::thread::Builder::new()
            .name("dsh-proxy".into())
            .spawn(move || accept_loop(&serving, &listener, &stop_rd))?;
        Ok(Proxy {
            shared,
            stop: Some(stop_wr),
            accept: Some(accept),
        })
    }

    /// Stops accepting, ends every open connection, and returns the decisions made, once
    /// every connection thread has returned: their code is the backend's library, which a
    /// reload may unload once the call is over, so none may outlive it. What a thread can
    /// still be blocked in is bounded: a name being resolved, a connection being opened
    /// ([`CONNECT_TIMEOUT`] in all).
    pub(crate) fn finish(mut self) -> Vec<Connection> {
        self.stop_serving();
        let shared = &self.shared;
        let mut live = shared.live.lock().unwrap_or_else(|e| e.into_inner());
        for (_, socket) in &live.sockets {
            let _ = socket.shutdown(Shutdown::Both);
        }
        let mut logged = false;
        while live.threads > 0 {
            let (next, waited) = shared
                .ended
                .wait_timeout(live, DRAIN)
                .unwrap_or_else(|e| e.into_inner());
            live = next;
            if waited.timed_out() && !logged && live.threads > 0 {
                logged = true;
                tracing::debug!(
                    threads = live.threads,
                    "network proxy: waiting for connections still resolving or opening after the command ended"
                );
            }
        }
        drop(live);
        let records =
            std::mem::take(&mut *shared.records.lock().unwrap_or_else(|e| e.into_inner()));
        if records.more > 0 {
            tracing::warn!(
                "the command made {} more connections through the network proxy than the {MAX_RECORDS} its record keeps (each is in the debug log)",
                records.more
            );
        }
        records.kept
    }

    fn stop_serving(&mut self) {
        self.stop = None;
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop_serving();
    }
}

fn accept_loop(shared: &Arc<Shared>, listener: &OwnedFd, stop: &OwnedFd) {
    loop {
        let mut fds = [
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if fds[1].revents != 0 {
            return;
        }
        if fds[0].revents & libc::POLLIN == 0 {
            continue;
        }
        // SAFETY: accepting on a listening socket this function borrows; no address wanted.
        let fd = unsafe {
            libc::accept4(
                listener.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if fd < 0 {
            continue;
        }
        // SAFETY: `fd` was just returned by accept4 and is owned by nobody else.
        let client = TcpStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
        {
            let mut live = shared.live.lock().unwrap_or_else(|e| e.into_inner());
            if live.threads >= MAX_CONNECTIONS {
                drop(live);
                let _ = respond(
                    &client,
                    503,
                    &format!("too many connections through the proxy at once (at most {MAX_CONNECTIONS})"),
                );
                continue;
            }
            live.threads += 1;
        }
        // Tracked before its thread starts: once this loop has returned, every accepted
        // connection can be shut down.
        let Some(client_id) = shared.track(&client) else {
            let mut live = shared.live.lock().unwrap_or_else(|e| e.into_inner());
            live.threads -= 1;
            continue;
        };
        let serving = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("dsh-proxy-conn".into())
            .spawn(move || {
                handle(&serving, client, client_id);
                let mut live = serving.live.lock().unwrap_or_else(|e| e.into_inner());
                live.threads -= 1;
                serving.ended.notify_all();
            });
        if spawned.is_err() {
            shared.untrack(&[client_id]);
            let mut live = shared.live.lock().unwrap_or_else(|e| e.into_inner());
            live.threads -= 1;
        }
    }
}

/// Writes a complete response with a plain-text body and closes the sending side.
fn respond(mut client: &TcpStream, status: u16, body: &str) -> io::Result<()> {
    let reason = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Error",
    };
    let body = format!("cordis sandbox: {body}\n");
    write!(
        client,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    client.flush()?;
    client.shutdown(Shutdown::Write)
}

/// Reads up to the end of the request head: the head's bytes and whatever followed it.
fn read_head(mut client: &TcpStream) -> io::Result<(Vec<u8>, Vec<u8>)> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = client.read(&mut chunk)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        if let Some(at) = buf[from..].windows(4).position(|w| w == b"\r\n\r\n") {
            let end = from + at + 4;
            let rest = buf.split_off(end);
            return Ok((buf, rest));
        }
        if buf.len() > MAX_HEAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "request head too long",
            ));
        }
    }
}

/// A request head a command sent, as far as the proxy reads it.
#[derive(Debug)]
pub struct Request {
    /// `CONNECT` or the plain-HTTP method.
    pub method: String,
    /// The host asked for (without brackets for IPv6).
    pub host: String,
    /// The port.
    pub port: u16,
    /// Plain HTTP: the head to send on (origin-form, `Connection: close`); `None` for
    /// `CONNECT`.
    pub forward: Option<Vec<u8>>,
    /// Whether the request has a body.
    pub has_body: bool,
}

/// `host:port` or `[v6]:port`.
fn split_authority(authority: &str) -> Option<(String, u16)> {
    let (host, port) = authority.rsplit_once(':')?;
    let port = port.parse::<u16>().ok().filter(|p| *p != 0)?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    (!host.is_empty()).then(|| (host.to_string(), port))
}

/// Reads a request head (up to and including its blank line): a `CONNECT host:port`, or
/// an absolute-form plain-HTTP request rewritten for the origin server. `Err` says why the
/// proxy answers `400`.
pub fn parse_request(head: &[u8]) -> Result<Request, String> {
    let mut headers = [httparse::EMPTY_HEADER; 96];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return Err("the request is not HTTP".to_string()),
    }
    let method = req.method.unwrap_or_default().to_string();
    let target = req.path.unwrap_or_default();
    let header = |name: &str| {
        req.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).trim().to_string())
    };
    let has_body =
        header("transfer-encoding").is_some() || header("content-length").is_some_and(|l| l != "0");
    if method == "CONNECT" {
        let (host, port) = split_authority(target)
            .ok_or_else(|| format!("`CONNECT {target}` names no `host:port`"))?;
        return Ok(Request {
            method,
            host,
            port,
            forward: None,
            has_body: false,
        });
    }
    let url = url::Url::parse(target).map_err(|_| {
        format!("`{method} {target}`: this is a proxy; send the absolute URL (`http://host/path`), or `CONNECT host:port` for HTTPS")
    })?;
    if url.scheme() != "http" {
        return Err(format!(
            "`{}` URLs are not proxied as plain requests; use `CONNECT host:port` (HTTPS_PROXY) for them",
            url.scheme()
        ));
    }
    let host = match url.host() {
        Some(url::Host::Domain(d)) => d.to_string(),
        Some(url::Host::Ipv4(ip)) => ip.to_string(),
        Some(url::Host::Ipv6(ip)) => ip.to_string(),
        None => return Err(format!("`{target}` names no host")),
    };
    let port = url
        .port_or_known_default()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("`{target}` names port 0"))?;
    let mut path = url.path().to_string();
    if let Some(q) = url.query() {
        path.push('?');
        path.push_str(q);
    }
    let version = if req.version == Some(0) { "1.0" } else { "1.1" };
    // The server is told the host the rules were applied to: a `Host` header naming
    // another (one a shared server would route to) is replaced.
    let authority = match url.port() {
        Some(port) => format!("{}:{port}", url.host_str().unwrap_or_default()),
        None => url.host_str().unwrap_or_default().to_string(),
    };
    let mut out = format!("{method} {path} HTTP/{version}\r\nHost: {authority}\r\n").into_bytes();
    for h in req.headers.iter() {
        let dropped = [
            "host",
            "connection",
            "proxy-connection",
            "keep-alive",
            "proxy-authorization",
        ];
        if dropped.iter().any(|n| h.name.eq_ignore_ascii_case(n)) {
            continue;
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok(Request {
        method,
        host,
        port,
        forward: Some(out),
        has_body,
    })
}

/// Why a request is not let through: the status and the reason.
type Refusal = (u16, String);

/// The rules applied to one request: the addresses to connect to and the rule that let it
/// through.
fn admit(shared: &Shared, req: &Request) -> Result<(Vec<IpAddr>, String), Refusal> {
    let refuse = |why: String| Err((403, why));
    let Some(host) = Host::parse(&req.host) else {
        return refuse(format!("`{}` is not a host name or an address", req.host));
    };
    let rules = &shared.rules;
    if rules.limited {
        if req.method == "CONNECT" {
            return refuse("`limited` is on: only plain-HTTP GET, HEAD and OPTIONS pass, and CONNECT (HTTPS) hides its method".to_string());
        }
        if !LIMITED_METHODS.contains(&req.method.as_str()) || req.has_body {
            return refuse(format!(
                "`limited` is on: only GET, HEAD and OPTIONS without a body pass, not {}",
                req.method
            ));
        }
    }
    let rule = match rules.decide(&host, req.port) {
        Verdict::Denied(rule) => return refuse(rule),
        Verdict::Allowed(rule) => rule,
        Verdict::Unlisted if !rules.ask => {
            return refuse("not in `allow` (unlisted hosts are refused)".to_string())
        }
        Verdict::Unlisted => {
            let approved = shared
                .asker
                .as_ref()
                .is_some_and(|ask| ask(&host.to_string(), req.port));
            if !approved {
                return refuse("not in `allow`, and the user did not approve it".to_string());
            }
            "approved by the user".to_string()
        }
    };
    let addrs = match &host {
        Host::Ip(ip) => vec![*ip],
        Host::Name(name) => shared
            .resolver
            .resolve(name, req.port)
            .map_err(|e| (502, e))?,
    };
    for addr in &addrs {
        rules.check_address(*addr, req.port).map_err(|e| (403, e))?;
    }
    Ok((addrs, rule))
}

/// Connects to the first of `addrs` that answers, within [`CONNECT_TIMEOUT`] in all.
fn connect(addrs: &[IpAddr], port: u16) -> Result<TcpStream, String> {
    let deadline = Instant::now() + CONNECT_TIMEOUT;
    let mut last = None;
    for addr in addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            last = Some(format!("no answer within {} s", CONNECT_TIMEOUT.as_secs()));
            break;
        }
        match TcpStream::connect_timeout(&SocketAddr::new(*addr, port), left) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(format!("{addr}: {e}")),
        }
    }
    Err(format!(
        "cannot connect: {}",
        last.unwrap_or_else(|| "no address".to_string())
    ))
}

/// Serves one client connection (tracked as `client_id`) to its end.
fn handle(shared: &Shared, client: TcpStream, client_id: u64) {
    let started = Instant::now();
    let _ = client.set_read_timeout(Some(HEAD_TIMEOUT));
    let Ok((head, rest)) = read_head(&client) else {
        shared.untrack(&[client_id]);
        return;
    };
    let mut record = Connection {
        host: String::new(),
        port: 0,
        method: String::new(),
        allowed: false,
        rule: String::new(),
        sent: 0,
        received: 0,
        millis: 0,
    };
    let outcome = parse_request(&head).map_err(|e| (400, e)).and_then(|req| {
        record.host = req.host.clone();
        record.port = req.port;
        record.method = req.method.clone();
        let (addrs, rule) = admit(shared, &req)?;
        record.rule = rule;
        let server = connect(&addrs, req.port).map_err(|e| (502, e))?;
        Ok((req, server))
    });
    let (req, server) = match outcome {
        Ok(ok) => ok,
        Err((status, why)) => {
            let _ = respond(
                &client,
                status,
                &format!("{}:{} refused: {why}", record.host, record.port),
            );
            record.rule = why;
            record.millis = started.elapsed().as_millis() as u64;
            if !record.method.is_empty() {
                shared.record(record);
            }
            shared.untrack(&[client_id]);
            return;
        }
    };
    record.allowed = true;
    let server_id = shared.track(&server);
    let _ = client.set_read_timeout(None);
    let opened = match &req.forward {
        None => (&client).write_all(b"HTTP/1.1 200 Connection established\r\n\r\n"),
        Some(head) => (&server).write_all(head),
    };
    if opened.is_ok() {
        // Under `limited`, nothing the client sends after the head goes on (a request
        // pipelined behind an allowed one is never seen by the server).
        let both = !(shared.rules.limited && req.forward.is_some());
        if both && !rest.is_empty() && (&server).write_all(&rest).is_ok() {
            record.sent = rest.len() as u64;
        }
        let (sent, received) = splice(&client, &server, both);
        record.sent += sent;
        record.received = received;
    }
    let _ = client.shutdown(Shutdown::Both);
    let _ = server.shutdown(Shutdown::Both);
    record.millis = started.elapsed().as_millis() as u64;
    shared.record(record);
    let mut ids = vec![client_id];
    ids.extend(server_id);
    shared.untrack(&ids);
}

/// Copies both ways until each side has ended (only server to client when `both` is
/// false): the bytes sent and received.
fn splice(client: &TcpStream, server: &TcpStream, both: bool) -> (u64, u64) {
    let upstream = both.then(|| {
        let (c, s) = (client.try_clone(), server.try_clone());
        std::thread::Builder::new()
            .name("dsh-proxy-up".into())
            .spawn(move || match (c, s) {
                (Ok(c), Ok(s)) => {
                    let n = pump(&c, &s);
                    let _ = s.shutdown(Shutdown::Write);
                    n
                }
                _ => 0,
            })
    });
    let received = pump(server, client);
    let _ = client.shutdown(Shutdown::Write);
    let sent = match upstream {
        Some(Ok(thread)) => thread.join().unwrap_or(0),
        _ => {
            let _ = server.shutdown(Shutdown::Both);
            0
        }
    };
    (sent, received)
}

/// The buffer of one direction of a connection: large, so a download moves in few reads
/// and writes (measured: 256 KiB moved more than `io::copy`'s 8 KiB and than `splice`
/// through a pipe, `cargo bench -p dsh-bash-sandbox --bench egress`).
const PUMP_BUFFER: usize = 256 * 1024;

/// Copies `from` to `to` until `from` ends or either fails: the bytes copied.
fn pump(mut from: &TcpStream, mut to: &TcpStream) -> u64 {
    let mut buf = vec![0u8; PUMP_BUFFER];
    let mut total = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return total,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return total,
        };
        if to.write_all(&buf[..n]).is_err() {
            return total;
        }
        total += n as u64;
    }
}

/// Receives the listening socket the supervisor sent over `channel` (one `SCM_RIGHTS`
/// message), without waiting: it was sent before the shell started.
pub(crate) fn receive_listener(channel: &OwnedFd) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: a zeroed msghdr is valid; the fields set below point at live buffers.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` describes buffers that outlive the call.
    let n = unsafe {
        libc::recvmsg(
            channel.as_raw_fd(),
            &mut msg,
            libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel filled `msg`; the header macros walk the control buffer it wrote.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null()
            || (*cmsg).cmsg_level != libc::SOL_SOCKET
            || (*cmsg).cmsg_type != libc::SCM_RIGHTS
        {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "the sandbox sent no listening socket",
            ));
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>());
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_read_as_a_proxy_reads_them() {
        let r = parse_request(b"CONNECT example.org:443 HTTP/1.1\r\nHost: example.org:443\r\n\r\n")
            .unwrap();
        assert_eq!(
            (r.method.as_str(), r.host.as_str(), r.port),
            ("CONNECT", "example.org", 443)
        );
        assert!(r.forward.is_none());
        let r = parse_request(b"CONNECT [::1]:8443 HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!((r.host.as_str(), r.port), ("::1", 8443));
        let r = parse_request(
            b"GET http://Example.org:8080/a/b?c=d HTTP/1.1\r\nHost: example.org:8080\r\nProxy-Connection: keep-alive\r\nAccept: */*\r\n\r\n",
        )
        .unwrap();
        assert_eq!(
            (r.host.as_str(), r.port, r.has_body),
            ("example.org", 8080, false)
        );
        assert_eq!(
            String::from_utf8(r.forward.unwrap()).unwrap(),
            "GET /a/b?c=d HTTP/1.1\r\nHost: example.org:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        // The server hears of the host the rules saw, not of another the client named.
        let r =
            parse_request(b"GET http://allowed.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n").unwrap();
        assert_eq!(
            String::from_utf8(r.forward.unwrap()).unwrap(),
            "GET / HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n"
        );
        let r =
            parse_request(b"POST http://h.test/ HTTP/1.1\r\nContent-Length: 3\r\n\r\n").unwrap();
        assert!(r.has_body);
        assert!(parse_request(b"GET /relative HTTP/1.1\r\n\r\n")
            .unwrap_err()
            .contains("absolute URL"));
        assert!(parse_request(b"GET https://h.test/ HTTP/1.1\r\n\r\n")
            .unwrap_err()
            .contains("CONNECT"));
        assert!(parse_request(b"CONNECT nohost HTTP/1.1\r\n\r\n").is_err());
        assert!(parse_request(b"CONNECT h.test:0 HTTP/1.1\r\n\r\n").is_err());
        assert!(parse_request(b"GET http://h.test:0/ HTTP/1.1\r\n\r\n").is_err());
        assert!(parse_request(b"\x16\x03\x01 tls\r\n\r\n").is_err());
    }
}
