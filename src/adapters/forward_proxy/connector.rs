//! How the proxy's HTTP client reaches an upstream: only through the
//! destination rules' checked connect (see `destinations`), from the
//! outgoing address when one is set.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::adapters::checked_connect::{CheckedConnectError, connect_checked_from};
use crate::domain::destinations::DestinationPolicy;

/// Connects the client's pooled connections (a `tower` service from URI to stream).
#[derive(Clone)]
pub struct CheckedConnector {
    pub destinations: Arc<DestinationPolicy>,
    pub outgoing: Option<IpAddr>,
    pub timeout: Duration,
}

impl CheckedConnector {
    /// A checked connection to `host:port`, with Nagle off: the proxy
    /// writes whole heads and body pieces, and small responses must not
    /// wait for an ACK.
    pub async fn connect(
        &self,
        host: &str,
        port: u16,
        tunnel: bool,
    ) -> Result<TcpStream, CheckedConnectError> {
        let stream = connect_checked_from(
            &self.destinations,
            host,
            port,
            tunnel,
            self.timeout,
            self.outgoing,
        )
        .await?;
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set on an upstream connection");
        }
        Ok(stream)
    }
}

impl tower_service::Service<Uri> for CheckedConnector {
    type Response = TokioIo<TcpStream>;
    type Error = CheckedConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connector = self.clone();
        Box::pin(async move {
            // The client only asks for the http:// URIs `request` built.
            let host = uri.host().unwrap_or_default();
            let port = uri.port_u16().unwrap_or(80);
            connector.connect(host, port, false).await.map(TokioIo::new)
        })
    }
}
