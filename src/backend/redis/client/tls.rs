//! TLS for `rediss://` servers on kvtier's own connection (`client::transport`): the
//! client configuration, built to verify servers as the redis crate's
//! `tls-rustls` connection does (redis 1.x, `create_rustls_config`): the
//! trust roots from `rustls-native-certs` (the system's, or the bundle
//! `SSL_CERT_FILE` / `SSL_CERT_DIR` name), any error loading them fatal,
//! no client certificate, rustls's default protocol versions (TLS 1.3 and
//! 1.2); `#insecure` URLs are refused when parsed (`url`). The crypto
//! provider is ring's, named here rather than taken from the process
//! default, so that another crate installing a default cannot change it.
//! The server name is the URL's host (an IP address included).

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, RootCertStore};
use std::io;
use std::sync::{Arc, OnceLock};

/// One tier's TLS client configuration, built by the first connection that
/// needs it and shared by every pool of the tier (a cluster's masters each
/// have one): loading the system's roots parses every certificate, once per
/// tier rather than once per node. Clones share it.
#[derive(Clone, Default)]
pub(in crate::backend::redis) struct SharedConfig(Arc<OnceLock<Arc<ClientConfig>>>);

impl SharedConfig {
    /// The configuration, built now if no connection has built it yet.
    pub(in crate::backend::redis) fn get(&self) -> io::Result<Arc<ClientConfig>> {
        if let Some(config) = self.0.get() {
            return Ok(Arc::clone(config));
        }
        let config = client_config()?;
        Ok(Arc::clone(self.0.get_or_init(|| config)))
    }
}

fn config_error(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("TLS configuration: {e}"),
    )
}

/// The client configuration for kvtier's TLS connections (see
/// [`SharedConfig`]).
fn client_config() -> io::Result<Arc<ClientConfig>> {
    let mut roots = RootCertStore::empty();
    let mut found = rustls_native_certs::load_native_certs();
    if let Some(error) = found.errors.pop() {
        return Err(config_error(error));
    }
    for cert in found.certs {
        roots.add(cert).map_err(config_error)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(config_error)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The name the server's certificate must carry: the URL's host.
pub(in crate::backend::redis) fn server_name(host: &str) -> io::Result<ServerName<'static>> {
    ServerName::try_from(host.to_string()).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{host}: not a usable TLS server name: {e}"),
        )
    })
}
