//! Mutual TLS between the nodes of one job, derived from a shared cluster
//! secret, so that only nodes holding the secret can ask for or serve blocks.
//!
//! Every node turns the secret into the same Ed25519 key
//! (seed = `blake3::derive_key("locafs cluster ca v1", secret)`) and the same
//! self-signed CA certificate ("locafs cluster CA"). At start each node makes
//! a fresh random Ed25519 leaf key and a certificate for it (SAN
//! `locafs-peer`, usable as server and client) signed by that CA, then drops
//! the CA key. The QUIC server requires a client certificate that chains to
//! the CA; the QUIC client checks the server's certificate against the same
//! CA under the name `locafs-peer`; both insist on TLS 1.3 and ALPN
//! `locafs/1`. A node whose secret differs fails the handshake both ways and
//! never sees a byte of data.
//!
//! Accepted secrets (after trimming ASCII whitespace, so a trailing newline
//! in the secret file does not matter): an even-length hex string, decoded,
//! credited 8 bits per decoded byte; anything else taken as raw bytes,
//! credited 4 bits per byte. At least 128 bits are required (16 random bytes
//! in hex, or 32 bytes of raw text), and material with fewer than 8 distinct
//! byte values is refused as an obvious mistake. `locafs secret` prints
//! [`generate_secret`]: 32 random bytes in hex.
//!
//! This module must never write a key or the secret anywhere (disk, logs,
//! `Debug` output), never accept a peer that does not chain to the cluster
//! CA, and never rely on a process-wide rustls crypto provider: the ring
//! provider is passed to every builder explicitly. It reads no files; the
//! caller hands it the secret file's contents.

use std::fmt;
use std::sync::Arc;

use quinn::crypto::rustls::{NoInitialCipherSuite, QuicClientConfig, QuicServerConfig};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PKCS_ED25519,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use thiserror::Error;

/// TLS server name every node's certificate carries and every client checks.
pub const PEER_SERVER_NAME: &str = "locafs-peer";

/// ALPN protocol id of the peer protocol; a new wire protocol gets a new id.
pub const ALPN: &[u8] = b"locafs/1";

/// Distinguished name (CN) of the cluster CA.
pub const CA_COMMON_NAME: &str = "locafs cluster CA";

/// Minimum estimated strength of a cluster secret, in bits.
pub const MIN_SECRET_BITS: usize = 128;

const CA_KEY_CONTEXT: &str = "locafs cluster ca v1";

/// PKCS#8 v1 (RFC 8410) prefix of an Ed25519 private key; the 32-byte seed
/// follows.
const ED25519_PKCS8_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// Why a node could not build its cluster identity.
#[derive(Debug, Error)]
pub enum TlsError {
    #[error("cluster secret is empty")]
    EmptySecret,
    #[error(
        "cluster secret too weak: about {estimated_bits} bits, need at least {required_bits} \
         (use 32 random bytes in hex, as printed by `locafs secret`)"
    )]
    WeakSecret {
        estimated_bits: usize,
        required_bits: usize,
    },
    #[error("could not build a peer certificate: {0}")]
    Certificate(#[from] rcgen::Error),
    #[error("could not configure TLS: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("could not build the client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("TLS configuration has no cipher suite QUIC can use: {0}")]
    Quic(#[from] NoInitialCipherSuite),
    #[error("system random number generator failed")]
    Random,
}

/// This node's membership credentials: the cluster CA certificate and its own
/// CA-signed leaf, ready-made as QUIC server and client configurations.
#[derive(Clone)]
pub struct ClusterIdentity {
    ca_cert: CertificateDer<'static>,
    leaf_cert: CertificateDer<'static>,
    cluster_id: String,
    server: Arc<QuicServerConfig>,
    client: Arc<QuicClientConfig>,
}

impl fmt::Debug for ClusterIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Keys stay out of logs.
        f.debug_struct("ClusterIdentity")
            .field("cluster_id", &self.cluster_id)
            .finish_non_exhaustive()
    }
}

impl ClusterIdentity {
    /// Builds the identity from the contents of the cluster secret file. All
    /// fallible TLS work happens here, so the config getters cannot fail.
    pub fn from_secret(secret: &[u8]) -> Result<Self, TlsError> {
        let material = secret_material(secret)?;
        let provider = ring_provider();

        let seed = blake3::derive_key(CA_KEY_CONTEXT, &material);
        let mut pkcs8 = Vec::with_capacity(ED25519_PKCS8_PREFIX.len() + seed.len());
        pkcs8.extend_from_slice(&ED25519_PKCS8_PREFIX);
        pkcs8.extend_from_slice(&seed);
        let ca_key =
            KeyPair::from_pkcs8_der_and_sign_algo(&PrivatePkcs8KeyDer::from(pkcs8), &PKCS_ED25519)?;

        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params
            .distinguished_name
            .push(DnType::CommonName, CA_COMMON_NAME);
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        // Fixed validity (rcgen's 1975..4096 defaults), serial from the public
        // key and deterministic Ed25519 signatures: the same secret gives
        // byte-identical CA certificates on every node.
        let ca_cert = ca_params.self_signed(&ca_key)?.der().clone();
        let issuer = Issuer::new(ca_params, ca_key);

        let leaf_key = KeyPair::generate_for(&PKCS_ED25519)?;
        let mut leaf_params = CertificateParams::new(vec![PEER_SERVER_NAME.to_owned()])?;
        leaf_params
            .distinguished_name
            .push(DnType::CommonName, PEER_SERVER_NAME);
        leaf_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        leaf_params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        leaf_params.use_authority_key_identifier_extension = true;
        let leaf_cert = leaf_params.signed_by(&leaf_key, &issuer)?.der().clone();
        drop(issuer); // The CA key is only needed to sign our leaf.
        let leaf_der = PrivateKeyDer::from(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));

        let mut roots = RootCertStore::empty();
        roots.add(ca_cert.clone())?;
        let roots = Arc::new(roots);

        let verifier =
            WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone()).build()?;
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![leaf_cert.clone()], leaf_der.clone_key())?;
        server.alpn_protocols = vec![ALPN.to_vec()];

        let mut client = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(roots)
            .with_client_auth_cert(vec![leaf_cert.clone()], leaf_der)?;
        client.alpn_protocols = vec![ALPN.to_vec()];

        let cluster_id = blake3::hash(&ca_cert).to_hex()[..16].to_owned();
        Ok(ClusterIdentity {
            ca_cert,
            leaf_cert,
            cluster_id,
            server: Arc::new(QuicServerConfig::try_from(server)?),
            client: Arc::new(QuicClientConfig::try_from(client)?),
        })
    }

    /// QUIC server configuration that demands a client certificate from the
    /// cluster CA. Transport parameters are quinn's defaults; the caller tunes
    /// them (stream windows for large blocks) on the returned value.
    pub fn server_config(&self) -> quinn::ServerConfig {
        quinn::ServerConfig::with_crypto(self.server.clone())
    }

    /// QUIC client configuration that presents this node's certificate and
    /// trusts only servers from the cluster CA; connect with
    /// [`PEER_SERVER_NAME`] as the server name.
    pub fn client_config(&self) -> quinn::ClientConfig {
        quinn::ClientConfig::new(self.client.clone())
    }

    /// The cluster CA certificate (DER); the same on every node of the job.
    pub fn ca_certificate(&self) -> &CertificateDer<'static> {
        &self.ca_cert
    }

    /// This node's leaf certificate (DER), new at every start.
    pub fn leaf_certificate(&self) -> &CertificateDer<'static> {
        &self.leaf_cert
    }

    /// Short public fingerprint of the cluster CA (16 hex digits), for logs:
    /// nodes with equal ids hold the same secret, without revealing it.
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }
}

/// A new cluster secret: 32 bytes from the system random generator, as 64
/// lowercase hex digits, for `locafs secret`.
pub fn generate_secret() -> Result<String, TlsError> {
    let mut bytes = [0u8; 32];
    ring_provider()
        .secure_random
        .fill(&mut bytes)
        .map_err(|_| TlsError::Random)?;
    Ok(hex(&bytes))
}

/// The ring provider, handed to each rustls builder explicitly.
fn ring_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Trims, decodes hex if it is hex, and checks the estimated strength.
fn secret_material(secret: &[u8]) -> Result<Vec<u8>, TlsError> {
    let trimmed = secret.trim_ascii();
    if trimmed.is_empty() {
        return Err(TlsError::EmptySecret);
    }
    let (material, bits_per_byte) = match unhex(trimmed) {
        Some(decoded) => (decoded, 8),
        None => (trimmed.to_vec(), 4),
    };
    let mut seen = [false; 256];
    for &b in &material {
        seen[b as usize] = true;
    }
    let distinct = seen.iter().filter(|&&s| s).count();
    let estimated_bits = if distinct < 8 {
        // log2(distinct) bits per byte at best: "aaaa…" or "0000…" is a
        // mistake, not a secret.
        material.len() * distinct.ilog2() as usize
    } else {
        material.len() * bits_per_byte
    };
    if distinct < 8 || estimated_bits < MIN_SECRET_BITS {
        return Err(TlsError::WeakSecret {
            estimated_bits,
            required_bits: MIN_SECRET_BITS,
        });
    }
    Ok(material)
}

fn unhex(s: &[u8]) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    s.chunks_exact(2)
        .map(|pair| {
            let hi = (pair[0] as char).to_digit(16)?;
            let lo = (pair[1] as char).to_digit(16)?;
            Some((hi * 16 + lo) as u8)
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 0xf) as usize] as char);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, SocketAddr};
    use std::time::Duration;
    use tokio::time::timeout;

    const SECRET: &[u8] = b"8f3a0c5d7e9b1a2c4d6e8f0a1b3c5d7e9f1a2b3c4d5e6f708192a3b4c5d6e7f8\n";
    const LIMIT: Duration = Duration::from_secs(10);

    fn localhost() -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, 0))
    }

    fn server(identity: &ClusterIdentity) -> quinn::Endpoint {
        quinn::Endpoint::server(identity.server_config(), localhost()).unwrap()
    }

    fn client(config: quinn::ClientConfig) -> quinn::Endpoint {
        let mut endpoint = quinn::Endpoint::client(localhost()).unwrap();
        endpoint.set_default_client_config(config);
        endpoint
    }

    /// Accepts one connection and answers one bidi stream with "pong:" plus
    /// what it read. Returns the handshake error if the client is refused.
    async fn serve_one(endpoint: quinn::Endpoint) -> Result<(), quinn::ConnectionError> {
        let incoming = endpoint.accept().await.expect("endpoint open");
        let conn = incoming.await?;
        let certs = conn
            .peer_identity()
            .and_then(|id| id.downcast::<Vec<CertificateDer<'static>>>().ok())
            .expect("client presented a certificate");
        assert_eq!(certs.len(), 1);
        let (mut send, mut recv) = conn.accept_bi().await?;
        let request = recv.read_to_end(1024).await.expect("request");
        send.write_all(&[b"pong:".as_slice(), &request].concat())
            .await
            .expect("reply");
        send.finish().expect("finish");
        // Keep the connection until the client has read and closed it.
        conn.closed().await;
        Ok(())
    }

    /// Connects, sends "ping" on a bidi stream and reads the whole reply.
    async fn ping(endpoint: &quinn::Endpoint, addr: SocketAddr) -> Result<Vec<u8>, String> {
        let conn = endpoint
            .connect(addr, PEER_SERVER_NAME)
            .map_err(|e| e.to_string())?
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
        send.write_all(b"ping").await.map_err(|e| e.to_string())?;
        send.finish().map_err(|e| e.to_string())?;
        let reply = recv.read_to_end(1024).await.map_err(|e| e.to_string())?;
        conn.close(0u32.into(), b"done");
        Ok(reply)
    }

    /// Runs one refused exchange: the server must never get a connection and
    /// the client must never get data.
    async fn assert_refused(server_identity: &ClusterIdentity, config: quinn::ClientConfig) {
        let srv = server(server_identity);
        let addr = srv.local_addr().unwrap();
        let server_task = tokio::spawn(serve_one(srv));
        let cli = client(config);
        let reply = timeout(LIMIT, ping(&cli, addr)).await.expect("no hang");
        assert!(reply.is_err(), "client got data: {reply:?}");
        let served = timeout(LIMIT, server_task).await.expect("no hang").unwrap();
        let err = served.expect_err("server accepted the connection");
        assert!(err.to_string().contains("certificate"), "{err}");
    }

    #[test]
    fn same_secret_gives_same_ca_and_fresh_leaves() {
        let a = ClusterIdentity::from_secret(SECRET).unwrap();
        let b = ClusterIdentity::from_secret(SECRET.trim_ascii()).unwrap();
        assert_eq!(a.ca_certificate(), b.ca_certificate());
        assert_eq!(a.cluster_id(), b.cluster_id());
        assert_ne!(a.leaf_certificate(), b.leaf_certificate());
        let other = ClusterIdentity::from_secret(&generate_secret().unwrap().into_bytes()).unwrap();
        assert_ne!(a.ca_certificate(), other.ca_certificate());
        assert!(!format!("{a:?}").contains("key"));
    }

    #[test]
    fn secret_parsing_and_strength() {
        // Hex: 16 bytes is enough, 15 is not.
        assert!(secret_material(hex(&(100u8..116).collect::<Vec<_>>()).as_bytes()).is_ok());
        assert!(matches!(
            secret_material(&hex(&(0u8..15).collect::<Vec<_>>()).into_bytes()),
            Err(TlsError::WeakSecret {
                estimated_bits: 120,
                ..
            })
        ));
        assert_eq!(
            secret_material(b"  0a0b0c0d0e0f1011121314151617181f \n").unwrap(),
            [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 31]
        );
        // Raw bytes: 32 are enough, 31 are not.
        let raw: Vec<u8> = (0u8..32).map(|i| b'A' + i % 26).collect();
        assert!(secret_material(&raw).is_ok());
        assert!(matches!(
            secret_material(&raw[..31]),
            Err(TlsError::WeakSecret { .. })
        ));
        // Degenerate and empty.
        assert!(matches!(
            secret_material(&[b'a'; 64]),
            Err(TlsError::WeakSecret {
                estimated_bits: 0,
                ..
            })
        ));
        assert!(matches!(
            secret_material(b"0".repeat(64).as_slice()),
            Err(TlsError::WeakSecret { .. })
        ));
        assert!(matches!(
            secret_material(b" \n\t"),
            Err(TlsError::EmptySecret)
        ));
        let err = ClusterIdentity::from_secret(b"hunter2").unwrap_err();
        assert!(err.to_string().contains("too weak"), "{err}");
    }

    #[test]
    fn generated_secret_is_64_hex_digits_and_accepted() {
        let s = generate_secret().unwrap();
        assert_eq!(s.len(), 64);
        assert_eq!(unhex(s.as_bytes()).unwrap().len(), 32);
        assert_ne!(s, generate_secret().unwrap());
        assert!(ClusterIdentity::from_secret(s.as_bytes()).is_ok());
    }

    #[tokio::test]
    async fn nodes_with_the_same_secret_connect_and_exchange_a_message() {
        let a = ClusterIdentity::from_secret(SECRET).unwrap();
        let b = ClusterIdentity::from_secret(SECRET).unwrap();
        let srv = server(&a);
        let addr = srv.local_addr().unwrap();
        let server_task = tokio::spawn(serve_one(srv));
        let cli = client(b.client_config());
        let reply = timeout(LIMIT, ping(&cli, addr))
            .await
            .expect("no hang")
            .unwrap();
        assert_eq!(reply, b"pong:ping");
        timeout(LIMIT, server_task)
            .await
            .expect("no hang")
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn a_node_with_another_secret_is_refused() {
        let a = ClusterIdentity::from_secret(SECRET).unwrap();
        let stranger =
            ClusterIdentity::from_secret(&generate_secret().unwrap().into_bytes()).unwrap();
        assert_refused(&a, stranger.client_config()).await;
    }

    #[tokio::test]
    async fn a_client_without_a_certificate_is_refused() {
        let a = ClusterIdentity::from_secret(SECRET).unwrap();
        // Trusts the right CA, so only the missing client certificate is wrong.
        let mut roots = RootCertStore::empty();
        roots.add(a.ca_certificate().clone()).unwrap();
        let mut tls = rustls::ClientConfig::builder_with_provider(ring_provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        tls.alpn_protocols = vec![ALPN.to_vec()];
        let config = quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls).unwrap()));
        assert_refused(&a, config).await;
    }

    #[tokio::test]
    async fn a_client_with_a_certificate_from_another_ca_is_refused() {
        let a = ClusterIdentity::from_secret(SECRET).unwrap();
        // Knows the (public) CA certificate, but not the secret: signs its own.
        let rogue = rcgen::generate_simple_self_signed(vec![PEER_SERVER_NAME.to_owned()]).unwrap();
        let mut roots = RootCertStore::empty();
        roots.add(a.ca_certificate().clone()).unwrap();
        let mut tls = rustls::ClientConfig::builder_with_provider(ring_provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(
                vec![rogue.cert.der().clone()],
                PrivatePkcs8KeyDer::from(rogue.signing_key.serialize_der()).into(),
            )
            .unwrap();
        tls.alpn_protocols = vec![ALPN.to_vec()];
        let config = quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls).unwrap()));
        assert_refused(&a, config).await;
    }
}
