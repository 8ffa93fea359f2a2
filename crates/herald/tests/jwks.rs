//! Client tokens signed by an identity provider's keys, published at a
//! JWKS endpoint the test runs (plain HTTP on loopback): a rotation in the
//! middle of a run, a `kid` not yet fetched, cache headers, and the
//! endpoint going down while the cached keys keep working.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_client::{ConnectOptions, Connection};
use herald_test_support::*;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

const RSA_1: &str = include_str!("fixtures/rsa_private.pem");
const RSA_2: &str = include_str!("fixtures/rsa2_private.pem");
const ED: &str = include_str!("fixtures/ed_private.pem");
const EC: &str = include_str!("fixtures/ec2_private.pem");

/// A signing key of the identity provider.
struct Signer {
    kid: &'static str,
    alg: Algorithm,
    key: EncodingKey,
}

impl Signer {
    fn new(kid: &'static str, alg: Algorithm, pem: &str) -> Self {
        let key = match alg {
            Algorithm::RS256 => EncodingKey::from_rsa_pem(pem.as_bytes()),
            Algorithm::ES256 => EncodingKey::from_ec_pem(pem.as_bytes()),
            _ => EncodingKey::from_ed_pem(pem.as_bytes()),
        };
        Self { kid, alg, key: key.unwrap() }
    }

    /// Its public half as a JWK, with its `kid`.
    fn jwk(&self) -> Jwk {
        let mut jwk = Jwk::from_encoding_key(&self.key, self.alg).unwrap();
        jwk.common.key_id = Some(self.kid.into());
        jwk
    }

    fn token(&self, sub: &str) -> String {
        let mut header = Header::new(self.alg);
        header.kid = Some(self.kid.into());
        let claims = json!({ "sub": sub, "exp": now_secs() + 300, "channels": ["chat:*"],
                             "iss": "https://idp.test/", "aud": "herald" });
        encode(&header, &claims, &self.key).unwrap()
    }
}

/// The JWKS endpoint: serves `set` with `Cache-Control: max-age=N`,
/// counts the requests; `down()` closes its port.
struct Idp {
    url: String,
    set: Arc<Mutex<JwkSet>>,
    requests: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Idp {
    async fn start(keys: &[&Signer], max_age: u64) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/.well-known/jwks.json", listener.local_addr().unwrap());
        let set = Arc::new(Mutex::new(JwkSet { keys: keys.iter().map(|k| k.jwk()).collect() }));
        let requests = Arc::new(AtomicUsize::new(0));
        let (s, n) = (set.clone(), requests.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else { return };
                let (s, n) = (s.clone(), n.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(k) => head.extend_from_slice(&buf[..k]),
                        }
                    }
                    n.fetch_add(1, Ordering::SeqCst);
                    let body = serde_json::to_string(&*s.lock().unwrap()).unwrap();
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncache-control: public, max-age={max_age}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = sock.write_all(resp.as_bytes()).await;
                });
            }
        });
        Self { url, set, requests, task }
    }

    fn publish(&self, keys: &[&Signer]) {
        *self.set.lock().unwrap() = JwkSet { keys: keys.iter().map(|k| k.jwk()).collect() };
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// The endpoint goes away: its port refuses connections.
    fn down(&self) {
        self.task.abort();
    }
}

async fn server(idp: &Idp, refresh_min: Duration) -> TestServer {
    init_tracing();
    let url = idp.url.clone();
    TestServer::start_with(move |c| {
        c.dev = false;
        c.jwt.jwks_url = Some(url);
        c.jwt.jwks_refresh_min = refresh_min;
        c.jwt.issuers = vec!["https://idp.test/".into()];
        c.jwt.audiences = vec!["herald".into()];
    })
    .await
}

/// Connect with `token`: `Ok` after a ping answered, or the HTTP status.
async fn connect(srv: &TestServer, token: &str) -> Result<(), u16> {
    match Connection::connect(&ConnectOptions::token(&srv.url, token)).await {
        Ok(mut conn) => {
            assert_eq!(conn.ping().await.unwrap().kind, "pong");
            Ok(())
        }
        Err(e) => Err(e.http_status().expect("refused before the upgrade")),
    }
}

async fn metric(srv: &TestServer, series: &str) -> Option<u64> {
    let text = reqwest::get(format!("{}/metrics", srv.url)).await.unwrap().text().await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse::<f64>().ok()).map(|v| v as u64))
}

#[tokio::test]
async fn a_rotated_key_is_fetched_on_its_first_token_while_old_tokens_keep_working() {
    let k1 = Signer::new("k1", Algorithm::RS256, RSA_1);
    let k2 = Signer::new("k2", Algorithm::RS256, RSA_2);
    let ed = Signer::new("ed", Algorithm::EdDSA, ED);
    let ec = Signer::new("ec", Algorithm::ES256, EC);
    // A long max-age: every fetch after the first is asked for by a kid.
    let idp = Idp::start(&[&k1], 3600).await;
    let min = Duration::from_secs(2);
    let srv = server(&idp, min).await;
    connect(&srv, &k1.token("ann")).await.expect("k1 verifies");
    let old_conn = Connection::connect(&ConnectOptions::token(&srv.url, k1.token("bob"))).await.unwrap();
    assert_eq!(idp.requests(), 1);
    assert_eq!(metric(&srv, "herald_jwks_keys ").await, Some(1));

    // The provider rotates: k2 signs new tokens, k1 stays published.
    idp.publish(&[&k1, &k2, &ed, &ec]);
    tokio::time::sleep(min).await; // the first fetch's rate limit passes
    connect(&srv, &k2.token("cat")).await.expect("an unknown kid fetches the JWKS again");
    assert_eq!(idp.requests(), 2);
    connect(&srv, &k1.token("dan")).await.expect("k1 still published: its tokens keep working");
    connect(&srv, &ed.token("eve")).await.expect("EdDSA from a JWKS");
    connect(&srv, &ec.token("fay")).await.expect("ES256 from a JWKS");
    assert_eq!(metric(&srv, "herald_jwks_keys ").await, Some(4));

    // A kid nobody published, right after a fetch: refused without a
    // fetch (at most one per jwks_refresh_min).
    let stranger = Signer::new("nobody", Algorithm::RS256, RSA_2);
    assert_eq!(connect(&srv, &stranger.token("gus")).await, Err(401));
    assert_eq!(connect(&srv, &stranger.token("gus")).await, Err(401));
    assert_eq!(idp.requests(), 2, "rate-limited");

    // The endpoint goes down: the keys held keep verifying, and the
    // failed fetch (asked for by an unknown kid) is counted.
    idp.down();
    tokio::time::sleep(min).await;
    assert_eq!(connect(&srv, &stranger.token("hal")).await, Err(401));
    assert_eq!(metric(&srv, "herald_jwks_refreshes_total{result=\"failed\"} ").await, Some(1));
    connect(&srv, &k1.token("ivy")).await.expect("cached k1 while the endpoint is down");
    connect(&srv, &k2.token("jon")).await.expect("cached k2 while the endpoint is down");
    assert_eq!(metric(&srv, "herald_jwks_keys ").await, Some(4));
    assert_eq!(metric(&srv, "herald_jwks_refreshes_total{result=\"ok\"} ").await, Some(2));
    // The connection opened with k1 at the start is still up.
    let mut old_conn = old_conn;
    assert_eq!(old_conn.ping().await.unwrap().kind, "pong");
}

#[tokio::test]
async fn cache_headers_schedule_the_refresh_and_a_withdrawn_key_stops_verifying() {
    let k1 = Signer::new("k1", Algorithm::RS256, RSA_1);
    let k2 = Signer::new("k2", Algorithm::RS256, RSA_2);
    let idp = Idp::start(&[&k1], 1).await;
    let srv = server(&idp, Duration::from_millis(100)).await;
    connect(&srv, &k1.token("ann")).await.expect("k1 verifies");
    // k1 is withdrawn: the next scheduled fetch (max-age 1s) drops it,
    // with no token asking.
    idp.publish(&[&k2]);
    let before = idp.requests();
    eventually("a fetch on max-age", || async { (idp.requests() > before).then_some(()) }).await;
    eventually("k1 refused once withdrawn", || async {
        (connect(&srv, &k1.token("bob")).await == Err(401)).then_some(())
    })
    .await;
    connect(&srv, &k2.token("cat")).await.expect("k2 verifies");
    // Claims: a wrong audience is refused whatever the key.
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some("k2".into());
    let wrong_aud =
        json!({ "sub": "dan", "exp": now_secs() + 300, "iss": "https://idp.test/", "aud": "other" });
    let token = encode(&header, &wrong_aud, &k2.key).unwrap();
    assert_eq!(connect(&srv, &token).await, Err(401));
}

#[test]
fn a_plain_http_jwks_url_off_loopback_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .env("HERALD_JWKS_URL", "http://idp.example.com/.well-known/jwks.json")
        .env_remove("HERALD_CONFIG")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("jwt: jwks_url: plain http is allowed only to a loopback address")
            && err.contains("idp.example.com"),
        "{err}"
    );
}
