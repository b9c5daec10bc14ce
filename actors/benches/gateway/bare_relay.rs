//! The gateway bench's bare relay: the least a hop in the gateway's place
//! must do, on the crates the gateway uses (hyper, hyper-util, tokio) and
//! its tunnel relay (`zero_copy`). Each client connection's request heads
//! are parsed by hyper; a plain request goes on as it came (absolute-form,
//! the client's `Proxy-Authorization` included) over one kept connection
//! to the relay's upstream proxy, and its answer comes back as it came; a
//! `CONNECT` is sent on to the upstream on a connection of its own and,
//! once both sides said `200`, the two sockets are spliced. No leasing, no
//! judging, no identities, no header rewriting, no limits.

use std::net::SocketAddr;
use std::sync::Arc;

use egress_proxies::adapters::forward_proxy::zero_copy;
use http_body_util::Empty;
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1 as client;
use hyper::server::conn::http1 as server;
use hyper::service::service_fn;
use hyper::upgrade::Upgraded;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;

type Answer = Response<http_body_util::Either<Incoming, Empty<Bytes>>>;

/// Serves every `(listen, upstream)` pair until the process ends.
pub async fn serve(pairs: Vec<(SocketAddr, SocketAddr)>) -> std::io::Result<()> {
    for (listen, upstream) in pairs {
        let listener = TcpListener::bind(listen).await?;
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(serve_client(client, upstream));
            }
        });
    }
    futures::future::pending().await
}

/// One client connection: its requests in turn, over one kept upstream connection.
async fn serve_client(client: TcpStream, upstream: SocketAddr) {
    let _ = client.set_nodelay(true);
    let kept: Arc<Mutex<Option<client::SendRequest<Incoming>>>> = Arc::default();
    let service = service_fn(move |request: Request<Incoming>| {
        let kept = kept.clone();
        async move {
            let answer = if request.method() == Method::CONNECT {
                tunnel(request, upstream).await
            } else {
                forward(request, upstream, &kept).await
            };
            Ok::<_, std::convert::Infallible>(answer.unwrap_or_else(|_| empty(StatusCode::BAD_GATEWAY)))
        }
    });
    let _ = server::Builder::new()
        .serve_connection(TokioIo::new(client), service)
        .with_upgrades()
        .await;
}

fn empty(status: StatusCode) -> Answer {
    let mut response = Response::new(http_body_util::Either::Right(Empty::new()));
    *response.status_mut() = status;
    response
}

async fn connect(upstream: SocketAddr) -> Result<TcpStream, String> {
    let stream = TcpStream::connect(upstream).await.map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// A plain request, on the kept upstream connection (opened when there is none).
async fn forward(
    request: Request<Incoming>,
    upstream: SocketAddr,
    kept: &Mutex<Option<client::SendRequest<Incoming>>>,
) -> Result<Answer, String> {
    let mut kept = kept.lock().await;
    let mut sender = match kept.take() {
        Some(sender) if !sender.is_closed() => sender,
        _ => {
            let (sender, connection) = client::handshake(TokioIo::new(connect(upstream).await?))
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(connection);
            sender
        }
    };
    sender.ready().await.map_err(|e| e.to_string())?;
    let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
    *kept = Some(sender);
    Ok(response.map(http_body_util::Either::Left))
}

/// `CONNECT`: asked of the upstream on a connection of its own; its answer
/// if not `200`, else `200` and the two sockets spliced once upgraded.
async fn tunnel(request: Request<Incoming>, upstream: SocketAddr) -> Result<Answer, String> {
    let (sender, connection) = client::handshake(TokioIo::new(connect(upstream).await?))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection.with_upgrades());
    let mut sender: client::SendRequest<Empty<Bytes>> = sender;
    let mut onward = Request::new(Empty::new());
    *onward.method_mut() = Method::CONNECT;
    *onward.uri_mut() = request.uri().clone();
    *onward.headers_mut() = request.headers().clone();
    let response = sender.send_request(onward).await.map_err(|e| e.to_string())?;
    if response.status() != StatusCode::OK {
        return Ok(response.map(http_body_util::Either::Left));
    }
    tokio::spawn(async move {
        let (Ok(client), Ok(upstream)) =
            tokio::join!(hyper::upgrade::on(request), hyper::upgrade::on(response))
        else {
            return;
        };
        if let (Some(client), Some(upstream)) = (end(client), end(upstream)) {
            let _ = zero_copy::relay(client, upstream, &|_, _| {}).await;
        }
    });
    Ok(empty(StatusCode::OK))
}

/// The socket under an upgraded connection, with the bytes hyper read past the head.
fn end(upgraded: Upgraded) -> Option<zero_copy::End> {
    let parts = upgraded.downcast::<TokioIo<TcpStream>>().ok()?;
    Some(zero_copy::End {
        socket: parts.io.into_inner(),
        early: parts.read_buf,
    })
}
