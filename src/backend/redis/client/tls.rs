//! TLS for `rediss://` servers on kvtier's own connection (`client::transport`): the
//! client configuration, built to verify servers exactly as the redis
//! crate's `tls-rustls` connection does (redis 1.x, `create_rustls_config`):
//! the trust roots from `rustls-native-certs` (the system's, or the bundle
//! `SSL_CERT_FILE` / `SSL_CERT_DIR` name), any error loading them fatal,
//! no client certificate, rustls's default protocol versions (TLS 1.3 and
//! 1.2), and `#insecure` URLs refused (the crate refuses them too unless
//! its `tls-rustls-insecure` feature is on, which kvtier does not turn on).
//! The crypto provider is ring's, named here rather than taken from the
//! process default, so that another crate installing a default cannot
//! change it. The server name is the URL's host (an IP address included).

use redis::{ErrorKind, RedisError, RedisResult};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, RootCertStore};
use std::sync::{Arc, OnceLock};

/// One tier's TLS client configuration, built by the first connection that
/// needs it and shared by every pool of the tier (a cluster's masters each
/// have one): loading the system's roots parses every certificate, once per
/// tier rather than once per node. Clones share it.
#[derive(Clone, Default)]
pub(in crate::backend::redis) struct SharedConfig(Arc<OnceLock<Arc<ClientConfig>>>);

impl SharedConfig {
    /// The configuration, built now if no connection has built it yet. An
    /// `#insecure` address is refused every time (it is never what the
    /// cache holds).
    pub(in crate::backend::redis) fn get(&self, insecure: bool) -> RedisResult<Arc<ClientConfig>> {
        if !insecure {
            if let Some(config) = self.0.get() {
                return Ok(Arc::clone(config));
            }
        }
        let config = client_config(insecure)?;
        Ok(Arc::clone(self.0.get_or_init(|| config)))
    }
}

/// The client configuration for kvtier's TLS connections (see
/// [`SharedConfig`]).
fn client_config(insecure: bool) -> RedisResult<Arc<ClientConfig>> {
    if insecure {
        // The crate's own message, for the same refusal.
        return Err(RedisError::from((
            ErrorKind::InvalidClientConfig,
            "Cannot create insecure client without tls-rustls-insecure feature",
        )));
    }
    let mut roots = RootCertStore::empty();
    let mut found = rustls_native_certs::load_native_certs();
    if let Some(error) = found.errors.pop() {
        return Err(error.into());
    }
    for cert in found.certs {
        roots.add(cert)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The name the server's certificate must carry: the URL's host.
pub(in crate::backend::redis) fn server_name(host: &str) -> RedisResult<ServerName<'static>> {
    ServerName::try_from(host.to_string()).map_err(|e| {
        RedisError::from((
            ErrorKind::InvalidClientConfig,
            "not a usable TLS server name",
            format!("{host}: {e}"),
        ))
    })
}
