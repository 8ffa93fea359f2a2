//! Key choice by `kid` with several static keys of each algorithm.

use jsonwebtoken::{encode, EncodingKey, Header};
use serde_json::json;

use super::*;
use crate::config::JwtKey;

const SECRET_1: &str = "a-first-hs256-secret-of-32-bytes!!";
const SECRET_2: &str = "a-second-hs256-secret-of-32-bytes!";

/// (alg, private PEM or secret, public PEM or secret) of two keys per algorithm.
fn pairs(alg: JwtAlg) -> [(&'static str, &'static str); 2] {
    match alg {
        JwtAlg::HS256 => [(SECRET_1, SECRET_1), (SECRET_2, SECRET_2)],
        JwtAlg::RS256 => [
            (include_str!("fixtures/rsa1.pem"), include_str!("fixtures/rsa1_pub.pem")),
            (include_str!("fixtures/rsa2.pem"), include_str!("fixtures/rsa2_pub.pem")),
        ],
        JwtAlg::ES256 => [
            (include_str!("fixtures/ec1.pem"), include_str!("fixtures/ec1_pub.pem")),
            (include_str!("fixtures/ec2.pem"), include_str!("fixtures/ec2_pub.pem")),
        ],
        JwtAlg::EdDSA => [
            (include_str!("fixtures/ed1.pem"), include_str!("fixtures/ed1_pub.pem")),
            (include_str!("fixtures/ed2.pem"), include_str!("fixtures/ed2_pub.pem")),
        ],
    }
}

const ALGS: [JwtAlg; 4] = [JwtAlg::HS256, JwtAlg::RS256, JwtAlg::ES256, JwtAlg::EdDSA];

fn config_key(alg: JwtAlg, kid: Option<&str>, public: &str) -> JwtKey {
    let (secret, pem) = match alg {
        JwtAlg::HS256 => (Some(public.to_owned()), None),
        _ => (None, Some(public.to_owned())),
    };
    JwtKey { kid: kid.map(str::to_owned), alg, secret, public_key_pem: pem }
}

fn sign(alg: JwtAlg, private: &str, kid: Option<&str>, claims: &serde_json::Value) -> String {
    let key = match alg {
        JwtAlg::HS256 => EncodingKey::from_secret(private.as_bytes()),
        JwtAlg::RS256 => EncodingKey::from_rsa_pem(private.as_bytes()).unwrap(),
        JwtAlg::ES256 => EncodingKey::from_ec_pem(private.as_bytes()).unwrap(),
        JwtAlg::EdDSA => EncodingKey::from_ed_pem(private.as_bytes()).unwrap(),
    };
    let mut header = Header::new(alg.into());
    header.kid = kid.map(str::to_owned);
    encode(&header, claims, &key).unwrap()
}

fn claims(sub: &str) -> serde_json::Value {
    let exp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 300;
    json!({ "sub": sub, "exp": exp })
}

fn verify(v: &JwtVerifier, token: &str) -> Result<String, AuthError> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(v.verify(token, None)).map(|id| id.sub.to_string())
}

#[test]
fn each_kid_selects_its_own_key_of_every_algorithm() {
    for alg in ALGS {
        let [(p1, k1), (p2, k2)] = pairs(alg);
        let cfg = JwtConfig {
            keys: vec![config_key(alg, Some("one"), k1), config_key(alg, Some("two"), k2)],
            ..JwtConfig::default()
        };
        let v = JwtVerifier::new(&cfg).unwrap();
        assert_eq!(verify(&v, &sign(alg, p1, Some("one"), &claims("a"))).unwrap(), "a", "{alg:?}");
        assert_eq!(verify(&v, &sign(alg, p2, Some("two"), &claims("b"))).unwrap(), "b", "{alg:?}");
        // The right key's token under the other key's kid: that key only.
        let e = verify(&v, &sign(alg, p1, Some("two"), &claims("c"))).unwrap_err();
        assert_eq!(e.message, "bad token signature", "{alg:?}");
        // A kid no key has, and no key without a kid: refused by name.
        let e = verify(&v, &sign(alg, p1, Some("three"), &claims("d"))).unwrap_err();
        assert_eq!(e.message, "no key for the token's `alg` and `kid`", "{alg:?}");
        // No kid: every key of the algorithm is tried in turn.
        assert_eq!(verify(&v, &sign(alg, p2, None, &claims("e"))).unwrap(), "e", "{alg:?}");
    }
}

#[test]
fn a_key_without_kid_takes_tokens_whose_kid_no_key_has() {
    let [(p1, k1), (p2, k2)] = pairs(JwtAlg::RS256);
    let cfg = JwtConfig {
        rs256_public_key_pem: Some(k1.into()),
        keys: vec![config_key(JwtAlg::RS256, Some("new"), k2)],
        ..JwtConfig::default()
    };
    let v = JwtVerifier::new(&cfg).unwrap();
    assert_eq!(verify(&v, &sign(JwtAlg::RS256, p1, Some("legacy"), &claims("a"))).unwrap(), "a");
    assert_eq!(verify(&v, &sign(JwtAlg::RS256, p2, Some("new"), &claims("b"))).unwrap(), "b");
    // The kid names the new key: the kid-less one is not tried.
    assert!(verify(&v, &sign(JwtAlg::RS256, p1, Some("new"), &claims("c"))).is_err());
}

#[test]
fn a_token_is_never_checked_with_a_key_of_another_algorithm() {
    let [(_, rsa_pub), _] = pairs(JwtAlg::RS256);
    let cfg = JwtConfig { keys: vec![config_key(JwtAlg::RS256, Some("k"), rsa_pub)], ..JwtConfig::default() };
    let v = JwtVerifier::new(&cfg).unwrap();
    // HS256 "signed" with the RSA public key's text: key confusion.
    let forged = sign(JwtAlg::HS256, rsa_pub, Some("k"), &claims("mallory"));
    assert!(verify(&v, &forged).is_err());
}

#[test]
fn issuer_and_audience_are_checked_when_configured() {
    let cfg = JwtConfig {
        hs256_secret: Some(SECRET_1.into()),
        issuers: vec!["https://idp.example.com/".into()],
        audiences: vec!["herald".into()],
        ..JwtConfig::default()
    };
    let v = JwtVerifier::new(&cfg).unwrap();
    let with = |iss: &str, aud: &str| {
        let mut c = claims("a");
        c["iss"] = json!(iss);
        c["aud"] = json!(aud);
        sign(JwtAlg::HS256, SECRET_1, None, &c)
    };
    assert!(verify(&v, &with("https://idp.example.com/", "herald")).is_ok());
    assert_eq!(
        verify(&v, &with("https://evil.example.com/", "herald")).unwrap_err().message,
        "token `iss` not accepted"
    );
    assert_eq!(
        verify(&v, &with("https://idp.example.com/", "other")).unwrap_err().message,
        "token `aud` not accepted"
    );
    assert!(verify(&v, &sign(JwtAlg::HS256, SECRET_1, None, &claims("a"))).is_err(), "iss and aud required");
    // Unconfigured, an `aud` in the token is not checked.
    let plain =
        JwtVerifier::new(&JwtConfig { hs256_secret: Some(SECRET_1.into()), ..JwtConfig::default() }).unwrap();
    assert!(verify(&plain, &with("anyone", "anything")).is_ok());
}

#[test]
fn bad_key_settings_are_refused_by_name() {
    let [(_, rsa_pub), _] = pairs(JwtAlg::RS256);
    let dup = JwtConfig {
        keys: vec![
            config_key(JwtAlg::RS256, Some("k"), rsa_pub),
            config_key(JwtAlg::RS256, Some("k"), rsa_pub),
        ],
        ..JwtConfig::default()
    };
    assert!(JwtVerifier::new(&dup).err().unwrap().contains("same `kid`"));
    let short = JwtConfig { keys: vec![config_key(JwtAlg::HS256, None, "short")], ..JwtConfig::default() };
    assert!(JwtVerifier::new(&short).err().unwrap().contains("at least 32 bytes"));
    let wrong =
        JwtConfig { keys: vec![config_key(JwtAlg::ES256, Some("e"), rsa_pub)], ..JwtConfig::default() };
    assert!(JwtVerifier::new(&wrong).err().unwrap().contains("keys[0] (kid `e`)"));
    let http = JwtConfig { jwks_url: Some("http://idp.example.com/jwks".into()), ..JwtConfig::default() };
    assert!(JwtVerifier::new(&http).err().unwrap().contains("loopback"));
}
