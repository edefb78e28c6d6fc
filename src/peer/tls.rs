//! Mutual TLS between the nodes of one job, so that only members of the
//! cluster can ask for or serve blocks. Membership comes either from a shared
//! cluster secret ([`ClusterIdentity::from_secret`]) or from an
//! administrator's own CA and node certificates
//! ([`ClusterIdentity::from_pem`]); the rest of the peer module does not
//! know which.
//!
//! From a secret, every node turns the secret into the same Ed25519 key
//! (seed = `blake3::derive_key("locafs cluster ca v1", secret's 32 bytes)`) and the same
//! self-signed CA certificate ("locafs cluster CA"). At start each node makes
//! a fresh random Ed25519 leaf key and a certificate for it (SAN
//! `locafs-peer`, usable as server and client) signed by that CA, then drops
//! the CA key. The QUIC server requires a client certificate that chains to
//! the CA; the QUIC client checks the server's certificate against the same
//! CA under the name `locafs-peer`. A node whose secret differs fails the
//! handshake both ways and never sees a byte of data.
//!
//! With admin certificates (`--peer-ca`, `--peer-cert`, `--peer-key`, PEM),
//! the server requires a client certificate that chains to one of the given
//! CAs (WebPKI: chain, validity dates, signatures, key usage clientAuth if
//! the certificate lists extended key usages), and the client checks the
//! server's chain the same way (serverAuth), but **not its names**: admins'
//! certificates carry the node's DNS name or IP, which need not match the
//! `--peers` entry used to reach it (a headless service name stands for many
//! pods). Holding a certificate from the CA is the authorization, as holding
//! the secret is. Only a name mismatch is forgiven, and only after the chain
//! has been verified (see [`ChainOnlyServerVerifier`]). A node checks at
//! start that its own certificate passes both checks, so a wrong CA,
//! expired certificate or missing extended key usage stops the mount with a
//! message instead of silently isolating the node. The cluster id is the
//! blake3 hash of the CA certificates (DER, sorted, concatenated), so all
//! nodes given the same CA file agree on it. The same certificate may be
//! given to several nodes: [`ClusterIdentity::leaf_is_fresh`] tells the
//! membership that meeting its own certificate does not prove that it
//! reached itself.
//!
//! Both ways insist on TLS 1.3 and ALPN `locafs/1`.
//!
//! Accepted secrets: only what `locafs secret` prints ([`generate_secret`]),
//! `locafs-secret-v1:` then 32 bytes from the system random generator as 64
//! hex digits, `:` and an 8-hex-digit check value (the first 4 bytes of a
//! keyed blake3 hash of the 32 bytes), after trimming ASCII whitespace so
//! that a trailing newline does not matter. The CA certificate that every
//! node presents is a public function of the secret, so anyone who can reach
//! a node's UDP port can test guesses of the secret offline, as fast as
//! they can hash: a hand-made passphrase (`imagenet-cluster-secret-2026`)
//! or hex typed by a person would be found. So anything else, including the
//! bare 64 hex digits older versions printed, is refused with a message
//! saying to run `locafs secret`; the prefix makes a secret recognisable
//! (and findable by secret scanners) and the check catches a truncated or
//! mistyped copy before the node silently fails every handshake.
//!
//! This module must never write a key or the secret anywhere (disk, logs,
//! `Debug` output, error messages), never accept a peer that does not chain
//! to the cluster CA, and never rely on a process-wide rustls crypto
//! provider: the ring provider is passed to every builder explicitly. It
//! reads no files; the caller hands it the secret file's or the PEM files'
//! contents.

use std::fmt;
use std::sync::Arc;

use quinn::crypto::rustls::{NoInitialCipherSuite, QuicClientConfig, QuicServerConfig};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PKCS_ED25519,
};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_cert_signed_by_trust_anchor, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use thiserror::Error;

/// TLS server name every node's certificate carries and every client checks.
pub const PEER_SERVER_NAME: &str = "locafs-peer";

/// ALPN protocol id of the peer protocol; a new wire protocol gets a new id.
pub const ALPN: &[u8] = b"locafs/1";

/// Distinguished name (CN) of the cluster CA.
pub const CA_COMMON_NAME: &str = "locafs cluster CA";

/// How a cluster secret printed by `locafs secret` begins.
pub const SECRET_PREFIX: &str = "locafs-secret-v1:";

/// Random bytes in a cluster secret: 256 bits.
pub const SECRET_BYTES: usize = 32;

/// Context of the keyed hash whose first bytes are a secret's check value.
const SECRET_CHECK_CONTEXT: &str = "locafs secret check v1";

/// Bytes of the check value at the end of a secret.
const SECRET_CHECK_BYTES: usize = 4;

const CA_KEY_CONTEXT: &str = "locafs cluster ca v1";

/// PKCS#8 v1 (RFC 8410) prefix of an Ed25519 private key; the 32-byte seed
/// follows.
const ED25519_PKCS8_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// Why a node could not build its cluster identity.
#[derive(Debug, Error)]
pub enum TlsError {
    #[error("cluster secret is empty: make one with `locafs secret --out FILE`")]
    EmptySecret,
    /// Not of the form `locafs secret` prints: a hand-made passphrase, or a
    /// secret of an older version (64 hex digits without the prefix).
    #[error(
        "not a secret made by `locafs secret` (those begin with {SECRET_PREFIX}): run \
         `locafs secret --out FILE` and give that file to every node; hand-made passphrases (and \
         the bare hex secrets of older versions) are refused, since anyone who can reach the \
         peer port can test guesses offline"
    )]
    NotGenerated,
    /// Has the prefix, but the rest is cut, mistyped or fails its check.
    #[error(
        "cluster secret is damaged ({0}): copy the file again from a node that works, or make \
         a new one for every node with `locafs secret --out FILE`"
    )]
    DamagedSecret(&'static str),
    /// Right form and check, but not random (fewer than 8 distinct byte
    /// values): made by hand, not by `locafs secret`.
    #[error("cluster secret is not random: make one with `locafs secret --out FILE`")]
    WeakSecret,
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
    /// Something wrong with one of the admin's PEM files; `problem` never
    /// quotes the file's contents.
    #[error("{problem}")]
    Pem { file: PemFile, problem: String },
}

/// Which of the admin's PEM inputs an error is about.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum PemFile {
    /// `--peer-ca`: the CA certificate(s).
    Ca,
    /// `--peer-cert`: this node's certificate chain.
    Cert,
    /// `--peer-key`: this node's private key.
    Key,
}

impl PemFile {
    /// The command line option that names this file.
    pub fn option(self) -> &'static str {
        match self {
            PemFile::Ca => "--peer-ca",
            PemFile::Cert => "--peer-cert",
            PemFile::Key => "--peer-key",
        }
    }
}

fn pem_error(file: PemFile, problem: impl Into<String>) -> TlsError {
    TlsError::Pem {
        file,
        problem: problem.into(),
    }
}

/// This node's membership credentials: the cluster CA certificate(s) and its
/// own CA-signed leaf, ready-made as QUIC server and client configurations.
#[derive(Clone)]
pub struct ClusterIdentity {
    ca_certs: Vec<CertificateDer<'static>>,
    leaf_cert: CertificateDer<'static>,
    /// The leaf was made at this start (cluster secret), so no other
    /// process presents it.
    fresh_leaf: bool,
    cluster_id: String,
    server: Arc<QuicServerConfig>,
    client: Arc<QuicClientConfig>,
}

impl fmt::Debug for ClusterIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Keys stay out of logs.
        f.debug_struct("ClusterIdentity")
            .field("cluster_id", &self.cluster_id)
            .field(
                "from",
                &if self.fresh_leaf {
                    "cluster secret"
                } else {
                    "admin certificates"
                },
            )
            .finish_non_exhaustive()
    }
}

impl ClusterIdentity {
    /// Builds the identity from the contents of the cluster secret file. All
    /// fallible TLS work happens here, so the config getters cannot fail.
    pub fn from_secret(secret: &[u8]) -> Result<Self, TlsError> {
        let material = secret_material(secret)?;
        let provider = ring_provider();

        // One fast hash is enough: its input is 256 bits from the system
        // random generator (secret_material accepts nothing else), so
        // guessing it offline from the public CA certificate is out of
        // reach however fast the hash; a slow password hash would only be
        // needed for a secret a person chose.
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
            ca_certs: vec![ca_cert],
            leaf_cert,
            fresh_leaf: true,
            cluster_id,
            server: Arc::new(QuicServerConfig::try_from(server)?),
            client: Arc::new(QuicClientConfig::try_from(client)?),
        })
    }

    /// Builds the identity from an administrator's PEM files: `ca_pem` one
    /// or more CA certificates (the trust anchors), `cert_pem` this node's
    /// certificate followed by any intermediates, `key_pem` its private key
    /// (PKCS#8, PKCS#1 RSA or SEC1 EC). Checks that the key matches the
    /// certificate and that the certificate chains to the CAs as a server
    /// and as a client now, so a node that every peer would refuse does not
    /// start. Errors say which input is wrong and never quote key material.
    pub fn from_pem(ca_pem: &[u8], cert_pem: &[u8], key_pem: &[u8]) -> Result<Self, TlsError> {
        let provider = ring_provider();
        let mut ca_certs = pem_certificates(ca_pem, PemFile::Ca)?;
        let chain = pem_certificates(cert_pem, PemFile::Cert)?;
        let key = pem_private_key(key_pem)?;

        let mut roots = RootCertStore::empty();
        for (i, ca) in ca_certs.iter().enumerate() {
            roots.add(ca.clone()).map_err(|e| {
                pem_error(
                    PemFile::Ca,
                    format!("certificate {} is not usable as a CA: {e}", i + 1),
                )
            })?;
        }
        let roots = Arc::new(roots);
        let client_verifier =
            WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone()).build()?;
        let server_verifier = Arc::new(ChainOnlyServerVerifier::new(roots, provider.clone())?);

        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(client_verifier.clone())
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(key_error)?;
        server.alpn_protocols = vec![ALPN.to_vec()];

        let mut client = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .dangerous()
            .with_custom_certificate_verifier(server_verifier.clone())
            .with_client_auth_cert(chain.clone(), key)
            .map_err(key_error)?;
        client.alpn_protocols = vec![ALPN.to_vec()];

        // What every peer will check of this node's certificate, checked here.
        let (leaf, intermediates) = chain.split_first().expect("at least one certificate");
        let now = UnixTime::now();
        let name = ServerName::try_from(PEER_SERVER_NAME).expect("a valid DNS name");
        server_verifier
            .verify_server_cert(leaf, intermediates, &name, &[], now)
            .map_err(|e| own_chain_error("server", e))?;
        client_verifier
            .verify_client_cert(leaf, intermediates, now)
            .map_err(|e| own_chain_error("client", e))?;

        // Order and repeats in the CA file do not change the id.
        ca_certs.sort_by(|a, b| a.as_ref().cmp(b.as_ref()));
        ca_certs.dedup();
        let mut hasher = blake3::Hasher::new();
        for ca in &ca_certs {
            hasher.update(ca.as_ref());
        }
        let cluster_id = hasher.finalize().to_hex()[..16].to_owned();
        Ok(ClusterIdentity {
            ca_certs,
            leaf_cert: leaf.clone(),
            fresh_leaf: false,
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

    /// The cluster CA certificates (DER); the same on every node of the job.
    /// One from a secret; with admin certificates those of `--peer-ca`,
    /// sorted, without repeats.
    pub fn ca_certificates(&self) -> &[CertificateDer<'static>] {
        &self.ca_certs
    }

    /// This node's leaf certificate (DER): new at every start from a secret,
    /// the admin's (possibly shared by several nodes) otherwise.
    pub fn leaf_certificate(&self) -> &CertificateDer<'static> {
        &self.leaf_cert
    }

    /// Whether the leaf certificate was made at this start, so that a peer
    /// presenting it can only be this very process. False with admin
    /// certificates, which several nodes may share.
    pub fn leaf_is_fresh(&self) -> bool {
        self.fresh_leaf
    }

    /// Short public fingerprint of the cluster CA(s) (16 hex digits), for
    /// logs: nodes with equal ids hold the same secret or trust the same
    /// CAs, without revealing anything secret.
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }
}

/// The client side's check of a peer's certificate with admin certificates:
/// rustls's WebPKI verifier (chain to one of the CAs, validity dates,
/// signatures, serverAuth usage) with only a name mismatch forgiven. Admins'
/// certificates name the node (DNS name, IP), not the `--peers` entry we
/// dialled, and membership in the CA is the authorization.
#[derive(Debug)]
pub struct ChainOnlyServerVerifier {
    webpki: Arc<WebPkiServerVerifier>,
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
}

impl ChainOnlyServerVerifier {
    fn new(roots: Arc<RootCertStore>, provider: Arc<CryptoProvider>) -> Result<Self, TlsError> {
        let webpki =
            WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone()).build()?;
        Ok(ChainOnlyServerVerifier {
            webpki,
            roots,
            provider,
        })
    }
}

impl ServerCertVerifier for ChainOnlyServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => {
                // rustls checks the name after the chain, but do not depend
                // on that: verify the chain (and usage, dates, signatures)
                // again before forgiving the name.
                verify_server_cert_signed_by_trust_anchor(
                    &ParsedCertificate::try_from(end_entity)?,
                    &self.roots,
                    intermediates,
                    now,
                    self.provider.signature_verification_algorithms.all,
                )?;
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// Every CERTIFICATE section of a PEM file, in order; other sections (a key
/// in the same file, say) are skipped.
fn pem_certificates(pem: &[u8], file: PemFile) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(file, pem_problem(&e)))?;
    if certs.is_empty() {
        return Err(pem_error(
            file,
            "no certificate found (expected PEM \"BEGIN CERTIFICATE\" sections)",
        ));
    }
    for (i, cert) in certs.iter().enumerate() {
        ParsedCertificate::try_from(cert).map_err(|e| {
            pem_error(
                file,
                format!(
                    "certificate {} is not a valid X.509 certificate: {e}",
                    i + 1
                ),
            )
        })?;
    }
    Ok(certs)
}

/// The first private key of a PEM file (PKCS#8, PKCS#1 RSA or SEC1 EC).
fn pem_private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    match PrivateKeyDer::from_pem_slice(pem) {
        Ok(key) => Ok(key),
        Err(pem::Error::NoItemsFound) => Err(pem_error(
            PemFile::Key,
            if pem
                .windows(30)
                .any(|w| w == b"BEGIN ENCRYPTED PRIVATE KEY---")
            {
                "the private key is encrypted; locafs needs it unencrypted \
                 (openssl pkey -in KEY -out PLAIN_KEY)"
            } else {
                "no private key found (expected PEM \"BEGIN PRIVATE KEY\", \
                 \"BEGIN RSA PRIVATE KEY\" or \"BEGIN EC PRIVATE KEY\")"
            },
        )),
        Err(e) => Err(pem_error(PemFile::Key, pem_problem(&e))),
    }
}

/// What is wrong with a PEM file, without quoting any of it.
fn pem_problem(e: &pem::Error) -> String {
    match e {
        pem::Error::MissingSectionEnd { .. } => "not valid PEM: a section has no END line",
        pem::Error::IllegalSectionStart { .. } => "not valid PEM: a malformed BEGIN line",
        pem::Error::Base64Decode(_) => "not valid PEM: bad base64 in a section",
        pem::Error::SectionTooLarge => "not valid PEM: a section is too large",
        _ => "not valid PEM",
    }
    .to_owned()
}

/// A private key rustls refused, as an error about `--peer-key`.
fn key_error(e: rustls::Error) -> TlsError {
    match e {
        rustls::Error::InconsistentKeys(_) => pem_error(
            PemFile::Key,
            "does not match the certificate (the first one in --peer-cert)",
        ),
        rustls::Error::General(_) => pem_error(
            PemFile::Key,
            "not a usable private key (supported: RSA, ECDSA P-256/P-384, Ed25519)",
        ),
        other => TlsError::Rustls(other),
    }
}

/// This node's own certificate failed the check its peers will make.
fn own_chain_error(role: &str, e: rustls::Error) -> TlsError {
    let hint = match &e {
        rustls::Error::InvalidCertificate(
            CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. },
        ) => {
            " (a node certificate is used as server and as client: give it extended key \
             usages serverAuth and clientAuth, or none)"
        }
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            " (it is not signed by a CA of --peer-ca; put intermediates after it in --peer-cert)"
        }
        _ => "",
    };
    pem_error(
        PemFile::Cert,
        format!("peers would refuse it as a {role} certificate: {e}{hint}"),
    )
}

/// A new cluster secret for `locafs secret`: 32 bytes from the system
/// random generator, in the form [`format_secret`] gives.
pub fn generate_secret() -> Result<String, TlsError> {
    let mut bytes = [0u8; SECRET_BYTES];
    ring_provider()
        .secure_random
        .fill(&mut bytes)
        .map_err(|_| TlsError::Random)?;
    Ok(format_secret(&bytes))
}

/// The text form of a cluster secret: [`SECRET_PREFIX`], the 32 bytes as 64
/// lowercase hex digits, `:` and the 8-hex-digit check value. Only
/// [`generate_secret`] should choose the bytes (tests use fixed ones).
pub fn format_secret(bytes: &[u8; SECRET_BYTES]) -> String {
    format!(
        "{SECRET_PREFIX}{}:{}",
        hex(bytes),
        hex(&secret_check(bytes))
    )
}

fn secret_check(bytes: &[u8; SECRET_BYTES]) -> [u8; SECRET_CHECK_BYTES] {
    let k = blake3::derive_key(SECRET_CHECK_CONTEXT, bytes);
    let mut c = [0u8; SECRET_CHECK_BYTES];
    c.copy_from_slice(&k[..SECRET_CHECK_BYTES]);
    c
}

/// The ring provider, handed to each rustls builder explicitly.
fn ring_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The 32 random bytes of a secret file's contents, if it holds a secret
/// as [`format_secret`] writes it (surrounding whitespace allowed).
fn secret_material(secret: &[u8]) -> Result<[u8; SECRET_BYTES], TlsError> {
    let trimmed = secret.trim_ascii();
    if trimmed.is_empty() {
        return Err(TlsError::EmptySecret);
    }
    let Some(rest) = trimmed.strip_prefix(SECRET_PREFIX.as_bytes()) else {
        return Err(TlsError::NotGenerated);
    };
    let malformed = TlsError::DamagedSecret("expected 64 hex digits, ':' and 8 hex digits");
    let (body, check) = match rest.iter().position(|&b| b == b':') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => return Err(malformed),
    };
    if body.len() != 2 * SECRET_BYTES || check.len() != 2 * SECRET_CHECK_BYTES {
        return Err(malformed);
    }
    let (Some(body), Some(check)) = (unhex(body), unhex(check)) else {
        return Err(malformed);
    };
    let mut bytes = [0u8; SECRET_BYTES];
    bytes.copy_from_slice(&body);
    if secret_check(&bytes)[..] != check[..] {
        return Err(TlsError::DamagedSecret("its check value does not match"));
    }
    let mut seen = [false; 256];
    for &b in &bytes {
        seen[b as usize] = true;
    }
    // 32 random bytes have fewer than 8 distinct values with a probability
    // below 2^-150: such bytes were chosen by hand (all zeros, say).
    if seen.iter().filter(|&&s| s).count() < 8 {
        return Err(TlsError::WeakSecret);
    }
    Ok(bytes)
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

/// Certificates for tests: a CA and node certificates signed by it.
#[cfg(test)]
pub(crate) mod test_pki {
    use super::*;
    use rcgen::{date_time_ymd, SanType};

    pub(crate) struct TestCa {
        pub issuer: Issuer<'static, KeyPair>,
        pub pem: String,
    }

    /// A CA made with rcgen, as an admin's PKI would be.
    pub(crate) fn test_ca(name: &str) -> TestCa {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let pem = params.self_signed(&key).unwrap().pem();
        TestCa {
            issuer: Issuer::new(params, key),
            pem,
        }
    }

    /// A node certificate (PEM) and its key (PKCS#8 PEM) signed by `ca`.
    pub(crate) fn node_cert_with(
        ca: &TestCa,
        dns: &str,
        ekus: Vec<ExtendedKeyUsagePurpose>,
        expired: bool,
    ) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec![dns.to_owned()]).unwrap();
        params
            .subject_alt_names
            .push(SanType::IpAddress("10.1.2.3".parse().unwrap()));
        params.distinguished_name.push(DnType::CommonName, dns);
        params.extended_key_usages = ekus;
        params.use_authority_key_identifier_extension = true;
        if expired {
            params.not_before = date_time_ymd(2000, 1, 1);
            params.not_after = date_time_ymd(2001, 1, 1);
        }
        let cert = params.signed_by(&key, &ca.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    pub(crate) fn node_cert(ca: &TestCa, dns: &str) -> (String, String) {
        node_cert_with(
            ca,
            dns,
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            false,
        )
    }

    pub(crate) fn admin_identity(ca: &TestCa, dns: &str) -> ClusterIdentity {
        let (cert, key) = node_cert(ca, dns);
        ClusterIdentity::from_pem(ca.pem.as_bytes(), cert.as_bytes(), key.as_bytes()).unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::test_pki::*;
    use super::*;
    use std::net::{Ipv4Addr, SocketAddr};
    use std::time::Duration;
    use tokio::time::timeout;

    const BYTES: [u8; SECRET_BYTES] = [
        0x8f, 0x3a, 0x0c, 0x5d, 0x7e, 0x9b, 0x1a, 0x2c, 0x4d, 0x6e, 0x8f, 0x0a, 0x1b, 0x3c, 0x5d,
        0x7e, 0x9f, 0x1a, 0x2b, 0x3c, 0x4d, 0x5e, 0x6f, 0x70, 0x81, 0x92, 0xa3, 0xb4, 0xc5, 0xd6,
        0xe7, 0xf8,
    ];

    /// A secret file's contents, with a trailing newline as `locafs secret
    /// --out FILE` leaves it.
    fn secret() -> Vec<u8> {
        format!("{}\n", format_secret(&BYTES)).into_bytes()
    }
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
        let a = ClusterIdentity::from_secret(&secret()).unwrap();
        let b = ClusterIdentity::from_secret(secret().trim_ascii()).unwrap();
        assert_eq!(a.ca_certificates(), b.ca_certificates());
        assert_eq!(a.cluster_id(), b.cluster_id());
        assert_ne!(a.leaf_certificate(), b.leaf_certificate());
        let other = ClusterIdentity::from_secret(&generate_secret().unwrap().into_bytes()).unwrap();
        assert_ne!(a.ca_certificates(), other.ca_certificates());
        assert!(a.leaf_is_fresh());
        assert!(!format!("{a:?}").contains("key"));
    }

    #[test]
    fn only_secrets_made_by_locafs_secret_are_accepted() {
        assert_eq!(secret_material(&secret()).unwrap(), BYTES);
        // Surrounding whitespace is fine, and so is upper-case hex.
        let padded = format!("  {}\r\n\n", format_secret(&BYTES));
        assert_eq!(secret_material(padded.as_bytes()).unwrap(), BYTES);
        let upper = format_secret(&BYTES)
            .to_uppercase()
            .replace("LOCAFS-SECRET-V1:", SECRET_PREFIX);
        assert_eq!(secret_material(upper.as_bytes()).unwrap(), BYTES);
        // Passphrases that used to pass the old strength estimate, and the
        // bare 64 hex digits of older versions: refused, saying what to do.
        for hand_made in [
            "0123456789abcdef0123456789abcdef",
            "abcdefghabcdefghabcdefghabcdefgh",
            "imagenet-cluster-secret-2026-abc",
            "8f3a0c5d7e9b1a2c4d6e8f0a1b3c5d7e9f1a2b3c4d5e6f708192a3b4c5d6e7f8",
            "hunter2",
        ] {
            let e = ClusterIdentity::from_secret(hand_made.as_bytes()).unwrap_err();
            assert!(matches!(e, TlsError::NotGenerated), "{hand_made}: {e}");
            let msg = e.to_string();
            assert!(msg.contains("run `locafs secret --out FILE`"), "{msg}");
            assert!(!msg.contains(hand_made), "{msg}");
        }
        // The prefix with a damaged rest: cut, a digit changed, the check
        // missing or altered.
        let good = format_secret(&BYTES);
        let flip = |at: usize| {
            let mut b = good.clone().into_bytes();
            b[at] = if b[at] == b'0' { b'1' } else { b'0' };
            String::from_utf8(b).unwrap()
        };
        let damaged = [
            good[..good.len() - 1].to_owned(),
            good[..SECRET_PREFIX.len() + 64].to_owned(),
            format!("{}:", &good[..SECRET_PREFIX.len() + 64]),
            flip(SECRET_PREFIX.len() + 5),
            flip(good.len() - 1),
            good.replacen(':', ";", 2).replacen(';', ":", 1),
            format!("{good}00"),
            good.replace(&good[SECRET_PREFIX.len()..SECRET_PREFIX.len() + 2], "zz"),
        ];
        for d in &damaged {
            let e = secret_material(d.as_bytes()).unwrap_err();
            assert!(matches!(e, TlsError::DamagedSecret(_)), "{d}: {e}");
            assert!(e.to_string().contains("locafs secret"), "{e}");
            assert!(!e.to_string().contains(&good[SECRET_PREFIX.len()..]), "{e}");
        }
        // Right form and check, but not random.
        assert!(matches!(
            secret_material(format_secret(&[0; SECRET_BYTES]).as_bytes()),
            Err(TlsError::WeakSecret)
        ));
        assert!(matches!(
            secret_material(b" \n\t"),
            Err(TlsError::EmptySecret)
        ));
    }

    #[test]
    fn generated_secrets_are_256_random_bits_with_prefix_and_check() {
        let s = generate_secret().unwrap();
        assert_eq!(s.len(), SECRET_PREFIX.len() + 64 + 1 + 8);
        assert!(s.starts_with(SECRET_PREFIX), "{s}");
        let bytes = secret_material(s.as_bytes()).unwrap();
        assert_eq!(format_secret(&bytes), s);
        assert_ne!(s, generate_secret().unwrap());
        assert!(ClusterIdentity::from_secret(s.as_bytes()).is_ok());
    }

    #[tokio::test]
    async fn nodes_with_the_same_secret_connect_and_exchange_a_message() {
        let a = ClusterIdentity::from_secret(&secret()).unwrap();
        let b = ClusterIdentity::from_secret(&secret()).unwrap();
        exchange_ok(&a, b.client_config()).await;
    }

    #[tokio::test]
    async fn a_node_with_another_secret_is_refused() {
        let a = ClusterIdentity::from_secret(&secret()).unwrap();
        let stranger =
            ClusterIdentity::from_secret(&generate_secret().unwrap().into_bytes()).unwrap();
        assert_refused(&a, stranger.client_config()).await;
    }

    #[tokio::test]
    async fn a_client_without_a_certificate_is_refused() {
        let a = ClusterIdentity::from_secret(&secret()).unwrap();
        // Trusts the right CA, so only the missing client certificate is wrong.
        let mut roots = RootCertStore::empty();
        roots.add(a.ca_certificates()[0].clone()).unwrap();
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
        let a = ClusterIdentity::from_secret(&secret()).unwrap();
        // Knows the (public) CA certificate, but not the secret: signs its own.
        let rogue = rcgen::generate_simple_self_signed(vec![PEER_SERVER_NAME.to_owned()]).unwrap();
        let mut roots = RootCertStore::empty();
        roots.add(a.ca_certificates()[0].clone()).unwrap();
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

    // ---- Admin-provided CA and certificates (made by `test_pki`) ----

    fn pem_err(ca: &str, cert: &str, key: &str) -> (PemFile, String) {
        match ClusterIdentity::from_pem(ca.as_bytes(), cert.as_bytes(), key.as_bytes()) {
            Err(TlsError::Pem { file, problem }) => (file, problem),
            Err(e) => panic!("not a PEM error: {e}"),
            Ok(_) => panic!("accepted"),
        }
    }

    /// One exchange where the client refuses the server's certificate: the
    /// client gets no data and the server no connection.
    async fn assert_refused_by_client(
        server_tls: Arc<QuicServerConfig>,
        config: quinn::ClientConfig,
    ) {
        let srv =
            quinn::Endpoint::server(quinn::ServerConfig::with_crypto(server_tls), localhost())
                .unwrap();
        let addr = srv.local_addr().unwrap();
        let server_task = tokio::spawn(serve_one(srv));
        let cli = client(config);
        let reply = timeout(LIMIT, ping(&cli, addr)).await.expect("no hang");
        let err = reply.expect_err("client accepted the server");
        assert!(err.contains("handshake"), "{err}");
        let served = timeout(LIMIT, server_task).await.expect("no hang").unwrap();
        assert!(served.is_err(), "server got a connection");
    }

    /// A TLS 1.3 / ALPN locafs/1 server presenting `cert_pem`, asking
    /// nothing of clients.
    fn raw_server(cert_pem: &str, key_pem: &str) -> Arc<QuicServerConfig> {
        let chain = pem_certificates(cert_pem.as_bytes(), PemFile::Cert).unwrap();
        let key = pem_private_key(key_pem.as_bytes()).unwrap();
        let mut tls = rustls::ServerConfig::builder_with_provider(ring_provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        tls.alpn_protocols = vec![ALPN.to_vec()];
        Arc::new(QuicServerConfig::try_from(tls).unwrap())
    }

    /// A client presenting `cert_pem` that trusts any server of `trust`.
    fn raw_client(trust: &ClusterIdentity, cert_pem: &str, key_pem: &str) -> quinn::ClientConfig {
        let mut roots = RootCertStore::empty();
        for ca in trust.ca_certificates() {
            roots.add(ca.clone()).unwrap();
        }
        let verifier = ChainOnlyServerVerifier::new(Arc::new(roots), ring_provider()).unwrap();
        let mut tls = rustls::ClientConfig::builder_with_provider(ring_provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_client_auth_cert(
                pem_certificates(cert_pem.as_bytes(), PemFile::Cert).unwrap(),
                pem_private_key(key_pem.as_bytes()).unwrap(),
            )
            .unwrap();
        tls.alpn_protocols = vec![ALPN.to_vec()];
        quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls).unwrap()))
    }

    async fn exchange_ok(server_identity: &ClusterIdentity, config: quinn::ClientConfig) {
        let srv = server(server_identity);
        let addr = srv.local_addr().unwrap();
        let server_task = tokio::spawn(serve_one(srv));
        let cli = client(config);
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
    async fn nodes_with_certificates_of_one_ca_connect_whatever_their_names() {
        let ca = test_ca("Example Corp CA");
        // Names that are not `locafs-peer` nor the address dialled.
        let a = admin_identity(&ca, "node-a.example.com");
        let b = admin_identity(&ca, "node-b.example.com");
        assert!(!a.leaf_is_fresh());
        assert_eq!(a.cluster_id(), b.cluster_id());
        assert_ne!(a.leaf_certificate(), b.leaf_certificate());
        exchange_ok(&a, b.client_config()).await;
        exchange_ok(&b, a.client_config()).await;
        // A node may talk to itself (or to a node sharing its certificate).
        exchange_ok(&a, a.client_config()).await;
    }

    #[tokio::test]
    async fn a_node_with_a_certificate_of_another_ca_is_refused_both_ways() {
        let ca = test_ca("Example Corp CA");
        let a = admin_identity(&ca, "node-a.example.com");
        let foreign_ca = test_ca("Example Corp CA");
        let stranger = admin_identity(&foreign_ca, "node-x.example.com");
        assert_ne!(a.cluster_id(), stranger.cluster_id());
        // The stranger as a client of a, and as a server for a.
        assert_refused(&a, stranger.client_config()).await;
        assert_refused(&stranger, a.client_config()).await;
        // Even with the very name the client asks for, from another CA.
        let (cert, key) = node_cert(&foreign_ca, PEER_SERVER_NAME);
        assert_refused_by_client(raw_server(&cert, &key), a.client_config()).await;
        // And a self-signed certificate is no better.
        let rogue = rcgen::generate_simple_self_signed(vec![PEER_SERVER_NAME.to_owned()]).unwrap();
        assert_refused_by_client(
            raw_server(&rogue.cert.pem(), &rogue.signing_key.serialize_pem()),
            a.client_config(),
        )
        .await;
        assert_refused(
            &a,
            raw_client(&a, &rogue.cert.pem(), &rogue.signing_key.serialize_pem()),
        )
        .await;
    }

    #[tokio::test]
    async fn only_the_name_is_forgiven_not_validity_or_usage() {
        let ca = test_ca("Example Corp CA");
        let a = admin_identity(&ca, "node-a.example.com");
        // Right CA, but expired: refused both ways.
        let (cert, key) = node_cert_with(
            &ca,
            "old.example.com",
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            true,
        );
        assert_refused_by_client(raw_server(&cert, &key), a.client_config()).await;
        assert_refused(&a, raw_client(&a, &cert, &key)).await;
        // Right CA, but only for clients: not accepted as a server.
        let (cert, key) = node_cert_with(
            &ca,
            "client.example.com",
            vec![ExtendedKeyUsagePurpose::ClientAuth],
            false,
        );
        assert_refused_by_client(raw_server(&cert, &key), a.client_config()).await;
        // Right CA, only for servers: not accepted as a client.
        let (cert, key) = node_cert_with(
            &ca,
            "server.example.com",
            vec![ExtendedKeyUsagePurpose::ServerAuth],
            false,
        );
        assert_refused(&a, raw_client(&a, &cert, &key)).await;
    }

    #[test]
    fn cluster_id_is_the_ca_fingerprint_whatever_the_order() {
        let ca1 = test_ca("CA one");
        let ca2 = test_ca("CA two");
        let (cert, key) = node_cert(&ca1, "n.example.com");
        let with = |cas: &str| {
            ClusterIdentity::from_pem(cas.as_bytes(), cert.as_bytes(), key.as_bytes()).unwrap()
        };
        let one = with(&ca1.pem);
        let both = with(&format!("{}{}", ca1.pem, ca2.pem));
        let both_reversed = with(&format!("{}\n{}{}", ca2.pem, ca1.pem, ca2.pem));
        assert_eq!(both.cluster_id(), both_reversed.cluster_id());
        assert_ne!(one.cluster_id(), both.cluster_id());
        assert_eq!(both_reversed.ca_certificates().len(), 2);
        // One CA: the first 16 hex digits of blake3 over its DER (b3sum).
        let der = pem_certificates(ca1.pem.as_bytes(), PemFile::Ca).unwrap();
        assert_eq!(
            one.cluster_id(),
            &blake3::hash(der[0].as_ref()).to_hex()[..16]
        );
        assert_eq!(one.cluster_id().len(), 16);
    }

    #[test]
    fn pem_inputs_in_one_file_and_with_intermediates() {
        // Certificate and key in one file, given as both.
        let ca = test_ca("Root CA");
        let (cert, key) = node_cert(&ca, "n.example.com");
        let both = format!("{key}{cert}");
        assert!(
            ClusterIdentity::from_pem(ca.pem.as_bytes(), both.as_bytes(), both.as_bytes()).is_ok()
        );
        // A chain through an intermediate CA; only the root is trusted.
        let inter_key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "Intermediate CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let inter_pem = params.signed_by(&inter_key, &ca.issuer).unwrap().pem();
        let inter = TestCa {
            issuer: Issuer::new(params, inter_key),
            pem: inter_pem,
        };
        let (leaf, leaf_key) = node_cert(&inter, "m.example.com");
        let chain = format!("{leaf}{}", inter.pem);
        let m = ClusterIdentity::from_pem(ca.pem.as_bytes(), chain.as_bytes(), leaf_key.as_bytes())
            .unwrap();
        let n = admin_identity(&ca, "n.example.com");
        assert_eq!(m.cluster_id(), n.cluster_id());
        // Without the intermediate the chain is incomplete.
        let (file, problem) = pem_err(&ca.pem, &leaf, &leaf_key);
        assert_eq!(file, PemFile::Cert);
        assert!(problem.contains("UnknownIssuer"), "{problem}");
    }

    #[test]
    fn bad_pem_inputs_name_the_file_and_never_quote_the_key() {
        let ca = test_ca("Example Corp CA");
        let (cert, key) = node_cert(&ca, "n.example.com");
        let (_, other_key) = node_cert(&ca, "o.example.com");
        let key_lines: Vec<&str> = key
            .lines()
            .chain(other_key.lines())
            .filter(|l| !l.starts_with("-----"))
            .collect();
        let cases: Vec<(String, String, String, PemFile, &str)> = vec![
            ("".into(), cert.clone(), key.clone(), PemFile::Ca, "no certificate found"),
            (key.clone(), cert.clone(), key.clone(), PemFile::Ca, "no certificate found"),
            (
                "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n".into(),
                cert.clone(),
                key.clone(),
                PemFile::Ca,
                "not valid PEM",
            ),
            (ca.pem.clone(), "".into(), key.clone(), PemFile::Cert, "no certificate found"),
            (ca.pem.clone(), cert.clone(), "".into(), PemFile::Key, "no private key found"),
            (ca.pem.clone(), cert.clone(), cert.clone(), PemFile::Key, "no private key found"),
            (
                ca.pem.clone(),
                cert.clone(),
                "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n"
                    .into(),
                PemFile::Key,
                "encrypted",
            ),
            (
                ca.pem.clone(),
                cert.clone(),
                key.lines().take(3).collect::<Vec<_>>().join("\n"),
                PemFile::Key,
                "not valid PEM",
            ),
            (ca.pem.clone(), cert.clone(), other_key.clone(), PemFile::Key, "does not match"),
            (
                test_ca("Another CA").pem,
                cert.clone(),
                key.clone(),
                PemFile::Cert,
                "not signed by a CA of --peer-ca",
            ),
        ];
        for (i, (ca_pem, cert_pem, key_pem, want_file, want)) in cases.into_iter().enumerate() {
            let (file, problem) = pem_err(&ca_pem, &cert_pem, &key_pem);
            assert_eq!(file, want_file, "case {i}: {problem}");
            assert!(problem.contains(want), "case {i}: {problem}");
            for line in &key_lines {
                assert!(
                    !problem.contains(line),
                    "case {i} quotes the key: {problem}"
                );
            }
        }
        // The node's own certificate must pass what its peers will check.
        let expired = node_cert_with(
            &ca,
            "old.example.com",
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            true,
        );
        let (file, problem) = pem_err(&ca.pem, &expired.0, &expired.1);
        assert_eq!(file, PemFile::Cert);
        assert!(problem.contains("expired"), "{problem}");
        let server_only = node_cert_with(
            &ca,
            "s.example.com",
            vec![ExtendedKeyUsagePurpose::ServerAuth],
            false,
        );
        let (file, problem) = pem_err(&ca.pem, &server_only.0, &server_only.1);
        assert_eq!(file, PemFile::Cert);
        assert!(problem.contains("clientAuth"), "{problem}");
        // No extended key usage at all is fine (any usage).
        let any = node_cert_with(&ca, "any.example.com", Vec::new(), false);
        let ok = ClusterIdentity::from_pem(ca.pem.as_bytes(), any.0.as_bytes(), any.1.as_bytes())
            .unwrap();
        let shown = format!("{ok:?}");
        assert!(shown.contains("admin certificates"), "{shown}");
        assert!(!shown.contains("KEY"), "{shown}");
    }
}
