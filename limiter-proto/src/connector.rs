//! The daemon's connections to an allocator: TCP from the configured source address, then
//! mutual TLS with the configuration of the moment ([`crate::reload`]), one handshake per
//! connection. tonic's own TLS settings are fixed when the channel is made, so a channel
//! made with them would present the certificate of the daemon's start for ever; a
//! channel made with this connector presents the renewed one at its next reconnect.

use std::{
    future::Future,
    io,
    net::{IpAddr, SocketAddr},
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::client::TlsStream;
use tonic::codegen::{http::Uri, Service};

use crate::ClientTls;

/// Connects to one allocator (whatever URI the channel asks for: the channel's endpoint
/// URI only names the HTTP/2 authority).
#[derive(Clone, Debug)]
pub struct TlsConnector {
    tls: Arc<ClientTls>,
    server_name: ServerName<'static>,
    to: SocketAddr,
    bind: Option<IpAddr>,
}

impl TlsConnector {
    /// Connects to `to` from `bind` (any address when `None`), and requires the server's
    /// certificate to name `server_name`.
    pub fn new(
        tls: Arc<ClientTls>,
        server_name: &str,
        to: SocketAddr,
        bind: Option<IpAddr>,
    ) -> Result<TlsConnector, String> {
        let server_name = ServerName::try_from(server_name.to_string())
            .map_err(|e| format!("server name {server_name:?}: {e}"))?;
        Ok(TlsConnector {
            tls,
            server_name,
            to,
            bind,
        })
    }

    async fn connect(self) -> io::Result<TokioIo<TlsStream<TcpStream>>> {
        let socket = match self.to {
            SocketAddr::V4(_) => TcpSocket::new_v4()?,
            SocketAddr::V6(_) => TcpSocket::new_v6()?,
        };
        if let Some(ip) = self.bind {
            socket.bind(SocketAddr::new(ip, 0))?;
        }
        let tcp = socket.connect(self.to).await?;
        tcp.set_nodelay(true)?;
        let tls = tokio_rustls::TlsConnector::from(self.tls.current())
            .connect(self.server_name, tcp)
            .await?;
        // The allocator speaks gRPC over HTTP/2 only (tonic refuses the connection too).
        if tls.get_ref().1.alpn_protocol() != Some(b"h2") {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the allocator did not agree to HTTP/2 (ALPN h2)",
            ));
        }
        Ok(TokioIo::new(tls))
    }
}

impl Service<Uri> for TlsConnector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        Box::pin(self.clone().connect())
    }
}
