//! TLS certificates for test servers, made with openssl (`TestCerts`).

use crate::redis_required;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Certificates for TLS servers on 127.0.0.1, made with openssl in a
/// scratch directory of their own (removed on drop): a CA (`ca`, what a
/// client must trust) and the server's certificate (`cert`, for IP
/// 127.0.0.1, signed by the CA) and key.
pub struct TestCerts {
    pub dir: PathBuf,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCerts {
    /// A server's settings to speak TLS with these certificates, asking no
    /// client certificate.
    pub(crate) fn server_settings(&self) -> [(&'static str, String); 4] {
        let path = |p: &PathBuf| p.to_string_lossy().into_owned();
        [
            ("tls-cert-file", path(&self.cert)),
            ("tls-key-file", path(&self.key)),
            ("tls-ca-cert-file", path(&self.ca)),
            ("tls-auth-clients", "no".to_string()),
        ]
    }

    /// New certificates, or None (after printing why) without openssl; a
    /// panic instead when `KVTIER_REQUIRE_REDIS=1` or `CI=true`.
    pub fn make() -> Option<TestCerts> {
        let dir = crate::scratch_dir();
        fs::create_dir_all(&dir).expect("create the certificates' directory");
        let certs = TestCerts {
            ca: dir.join("ca.pem"),
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
            dir,
        };
        let ext = certs.dir.join("ext.cnf");
        fs::write(
            &ext,
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
        )
        .unwrap();
        let (ca_key, csr) = (certs.dir.join("ca.key"), certs.dir.join("srv.csr"));
        let made = make_ca(&certs.ca, &ca_key, "kvtier test CA")
            && openssl(&[
                "req".as_ref(),
                "-newkey".as_ref(),
                "rsa:2048".as_ref(),
                "-nodes".as_ref(),
                "-subj".as_ref(),
                "/CN=127.0.0.1".as_ref(),
                "-keyout".as_ref(),
                certs.key.as_os_str(),
                "-out".as_ref(),
                csr.as_os_str(),
            ])
            && openssl(&[
                "x509".as_ref(),
                "-req".as_ref(),
                "-in".as_ref(),
                csr.as_os_str(),
                "-CA".as_ref(),
                certs.ca.as_os_str(),
                "-CAkey".as_ref(),
                ca_key.as_os_str(),
                "-CAcreateserial".as_ref(),
                "-days".as_ref(),
                "1".as_ref(),
                "-extfile".as_ref(),
                ext.as_os_str(),
                "-out".as_ref(),
                certs.cert.as_os_str(),
            ]);
        if made {
            return Some(certs);
        }
        assert!(!redis_required(), "openssl is needed to make certificates");
        crate::skip("openssl could not make certificates");
        None
    }

    /// Another CA's certificate, which signed nothing the server shows.
    pub fn other_ca(&self) -> PathBuf {
        let (ca, key) = (self.dir.join("other-ca.pem"), self.dir.join("other-ca.key"));
        assert!(make_ca(&ca, &key, "another CA"), "openssl makes a CA");
        ca
    }
}

impl Drop for TestCerts {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A self-signed CA certificate and its key.
pub(crate) fn make_ca(cert: &Path, key: &Path, name: &str) -> bool {
    openssl(&[
        "req".as_ref(),
        "-x509".as_ref(),
        "-newkey".as_ref(),
        "rsa:2048".as_ref(),
        "-nodes".as_ref(),
        "-days".as_ref(),
        "1".as_ref(),
        "-subj".as_ref(),
        format!("/CN={name}").as_ref(),
        "-keyout".as_ref(),
        key.as_os_str(),
        "-out".as_ref(),
        cert.as_os_str(),
    ])
}

pub(crate) fn openssl(args: &[&std::ffi::OsStr]) -> bool {
    Command::new("openssl")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success())
}
