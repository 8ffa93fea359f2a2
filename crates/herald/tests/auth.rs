//! WebSocket authentication: checked before the upgrade, JWT algorithms,
//! claims, and channel permissions.

use herald_client::{ConnectOptions, Connection};
use herald_test_support::*;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::json;

const RSA_PRIV: &str = include_str!("fixtures/rsa_private.pem");
const RSA_PUB: &str = include_str!("fixtures/rsa_public.pem");
const EC_PRIV: &str = include_str!("fixtures/ec_private.pem");
const EC_PUB: &str = include_str!("fixtures/ec_public.pem");

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

fn hs(claims: serde_json::Value) -> String {
    encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(JWT_SECRET.as_bytes())).unwrap()
}

fn claims(sub: &str) -> serde_json::Value {
    json!({ "sub": sub, "exp": now() + 300, "channels": ["chat:*"], "publish": ["chat:room1"] })
}

async fn server() -> TestServer {
    TestServer::start_with(|c| {
        c.dev = false;
        c.jwt.rs256_public_key_pem = Some(RSA_PUB.into());
        c.jwt.es256_public_key_pem = Some(EC_PUB.into());
    })
    .await
}

async fn refused(_srv: &TestServer, opts: ConnectOptions) -> (u16, String) {
    let Err(err) = Connection::connect(&opts).await else { panic!("connection must be refused") };
    (err.http_status().expect("an HTTP status, not a 101"), err.code().unwrap_or("").to_owned())
}

#[tokio::test]
async fn valid_tokens_of_each_algorithm_connect() {
    let srv = server().await;
    let c = claims("u1");
    let rs =
        encode(&Header::new(Algorithm::RS256), &c, &EncodingKey::from_rsa_pem(RSA_PRIV.as_bytes()).unwrap())
            .unwrap();
    let es =
        encode(&Header::new(Algorithm::ES256), &c, &EncodingKey::from_ec_pem(EC_PRIV.as_bytes()).unwrap())
            .unwrap();
    for token in [hs(c.clone()), rs, es] {
        let mut conn = Connection::connect(&ConnectOptions::token(&srv.url, &token)).await.unwrap();
        assert_eq!(conn.ping().await.unwrap().kind, "pong");
    }
    // ?token= works too.
    let opts = ConnectOptions::token(&srv.url, hs(c)).with_token_in_query(true);
    Connection::connect(&opts).await.unwrap();
}

#[tokio::test]
async fn bad_tokens_are_refused_before_the_upgrade() {
    let srv = server().await;
    let url = srv.url.clone();
    // Bad signature.
    let forged = encode(
        &Header::new(Algorithm::HS256),
        &claims("u"),
        &EncodingKey::from_secret(b"another-secret-of-enough-length!!"),
    )
    .unwrap();
    assert_eq!(refused(&srv, ConnectOptions::token(&url, forged)).await, (401, "unauthorized".into()));
    // alg: none.
    let b64 = |v: serde_json::Value| {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(&v).unwrap())
    };
    let none = format!("{}.{}.", b64(json!({"alg":"none","typ":"JWT"})), b64(claims("u")));
    assert_eq!(refused(&srv, ConnectOptions::token(&url, none)).await.0, 401);
    // Expired.
    let expired = hs(json!({ "sub": "u", "exp": now() - 3600 }));
    assert_eq!(refused(&srv, ConnectOptions::token(&url, expired)).await, (401, "token_expired".into()));
    // Not valid yet.
    let early = hs(json!({ "sub": "u", "exp": now() + 3600, "nbf": now() + 1800 }));
    assert_eq!(refused(&srv, ConnectOptions::token(&url, early)).await, (401, "unauthorized".into()));
    // Missing exp.
    let no_exp = hs(json!({ "sub": "u" }));
    assert_eq!(refused(&srv, ConnectOptions::token(&url, no_exp)).await.0, 401);
    // Key confusion: HS256 "signed" with the RSA public key as the secret.
    let confused =
        encode(&Header::new(Algorithm::HS256), &claims("u"), &EncodingKey::from_secret(RSA_PUB.as_bytes()))
            .unwrap();
    assert_eq!(refused(&srv, ConnectOptions::token(&url, confused)).await.0, 401);
    // No credentials at all; dev users outside dev mode.
    assert_eq!(refused(&srv, ConnectOptions::new(&url, herald_client::Auth::None)).await.0, 401);
    assert_eq!(refused(&srv, ConnectOptions::dev_user(&url, "mallory")).await, (403, "forbidden".into()));
}

#[tokio::test]
async fn channel_permissions_come_from_the_token() {
    let srv = server().await;
    let mut conn = Connection::connect(&ConnectOptions::token(&srv.url, hs(claims("42")))).await.unwrap();
    assert_eq!(conn.subscribe("chat:any", None).await.unwrap().kind, "ok");
    assert_eq!(conn.subscribe("user:42", None).await.unwrap().kind, "ok", "own user channel");
    let e = conn.subscribe("user:43", None).await.unwrap();
    assert_eq!((e.kind.as_str(), e.code.clone()), ("error", Some(json!("forbidden"))));
    let e = conn.subscribe("room:x", None).await.unwrap();
    assert_eq!(e.code, Some(json!("forbidden")));
    assert_eq!(conn.publish("chat:room1", &json!(1), None).await.unwrap().kind, "ok");
    let e = conn.publish("chat:room2", &json!(1), None).await.unwrap();
    assert_eq!(e.code, Some(json!("forbidden")));
    // The HS256 key must not verify RS256 tokens and vice versa (one key per alg).
    let srv_hs_only = TestServer::start_with(|c| c.dev = false).await;
    let rs = encode(
        &Header::new(Algorithm::RS256),
        &claims("u"),
        &EncodingKey::from_rsa_pem(RSA_PRIV.as_bytes()).unwrap(),
    )
    .unwrap();
    assert_eq!(refused(&srv_hs_only, ConnectOptions::token(&srv_hs_only.url, rs)).await.0, 401);
}

#[tokio::test]
async fn api_requires_a_known_key() {
    let srv = server().await;
    let r = srv.publish_with("chat:a", json!({ "data": 1 }), None, None).await;
    assert_eq!((r.status, r.code()), (401, "unauthorized"));
    let r = srv.publish_with("chat:a", json!({ "data": 1 }), None, Some("not-a-configured-key")).await;
    assert_eq!((r.status, r.code()), (401, "unauthorized"));
    assert!(r.is_problem());
}
