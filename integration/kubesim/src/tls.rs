//! The simulator's PKI: a self-signed CA and a serving certificate for 127.0.0.1/localhost/
//! `kubernetes.default.svc` signed by it (rcgen on ring), and the rustls server config
//! (HTTP/1.1 only). Generates fresh keys per start; owns no files.

use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("generating certificates: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("building the TLS config: {0}")]
    Rustls(#[from] rustls::Error),
}

/// A CA and a serving certificate it signed.
#[derive(Debug, Clone)]
pub struct Pki {
    pub ca_pem: String,
    pub ca_der: Vec<u8>,
    pub server_config: Arc<rustls::ServerConfig>,
}

impl Pki {
    pub fn generate() -> Result<Self, TlsError> {
        Self::generate_with(&[])
    }

    /// Like `generate`, with `extra_sans` (IP addresses or DNS names) added to the serving
    /// certificate, e.g. the address a relay exposes the server at.
    pub fn generate_with(extra_sans: &[String]) -> Result<Self, TlsError> {
        let ca_key = KeyPair::generate()?;
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "kubesim-ca");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca, ca_key);

        let key = KeyPair::generate()?;
        let mut srv = CertificateParams::new(vec![
            "localhost".to_string(),
            "kubernetes".to_string(),
            "kubernetes.default".to_string(),
            "kubernetes.default.svc".to_string(),
            "kubernetes.default.svc.cluster.local".to_string(),
        ])?;
        srv.subject_alt_names
            .push(SanType::IpAddress(std::net::IpAddr::from([127, 0, 0, 1])));
        srv.subject_alt_names
            .push(SanType::IpAddress(std::net::IpAddr::from(
                std::net::Ipv6Addr::LOCALHOST,
            )));
        for san in extra_sans {
            srv.subject_alt_names
                .push(match san.parse::<std::net::IpAddr>() {
                    Ok(ip) => SanType::IpAddress(ip),
                    Err(_) => SanType::DnsName(san.as_str().try_into()?),
                });
        }
        srv.distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        srv.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        srv.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let cert = srv.signed_by(&key, &issuer)?;

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(
                vec![
                    CertificateDer::from(cert.der().to_vec()),
                    CertificateDer::from(ca_cert.der().to_vec()),
                ],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )?;
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            ca_pem: ca_cert.pem(),
            ca_der: ca_cert.der().to_vec(),
            server_config: Arc::new(cfg),
        })
    }
}
