//! [`JwtVerifier`]: a client token checked against every key that may
//! have signed it.
//!
//! The keys are the static ones of `[jwt]` and, with `jwks_url`, those of
//! the identity provider's JWKS ([`Jwks`]). A token is checked only with
//! keys of its header's `alg` (so an HS256 token "signed" with an RSA
//! public key, and `alg: none`, never verify), chosen by its `kid`: the
//! keys of that `kid`, else the keys without one; a token without a `kid`
//! tries every key of its `alg` in turn. A `kid` no key has makes the JWKS
//! refresh (rate-limited) before the token is refused.

use std::sync::Arc;

use herald_proto::ErrorCode;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

use super::jwks::Jwks;
use super::{identity_from, AuthError, Claims, Identity};
use crate::config::{JwtAlg, JwtConfig};

/// One verification key.
#[derive(Clone)]
pub(crate) struct Key {
    /// The `kid` of the tokens it signs; `None`: any token of its `alg`
    /// whose `kid` no other key has.
    pub kid: Option<String>,
    pub alg: Algorithm,
    pub key: DecodingKey,
}

impl std::fmt::Debug for Key {
    // Never the key material.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key").field("kid", &self.kid).field("alg", &self.alg).finish_non_exhaustive()
    }
}

impl From<JwtAlg> for Algorithm {
    fn from(a: JwtAlg) -> Self {
        match a {
            JwtAlg::HS256 => Algorithm::HS256,
            JwtAlg::RS256 => Algorithm::RS256,
            JwtAlg::ES256 => Algorithm::ES256,
            JwtAlg::EdDSA => Algorithm::EdDSA,
        }
    }
}

/// The least an HS256 secret may hold, in bytes.
pub const MIN_SECRET_BYTES: usize = 32;

/// The static keys of `[jwt]`, checked.
fn static_keys(cfg: &JwtConfig) -> Result<Vec<Key>, String> {
    let mut keys = Vec::new();
    if let Some(secret) = &cfg.hs256_secret {
        keys.push(key(None, JwtAlg::HS256, Some(secret), None).map_err(|e| format!("hs256_secret {e}"))?);
    }
    if let Some(pem) = &cfg.rs256_public_key_pem {
        keys.push(
            key(None, JwtAlg::RS256, None, Some(pem)).map_err(|e| format!("rs256_public_key_pem {e}"))?,
        );
    }
    if let Some(pem) = &cfg.es256_public_key_pem {
        keys.push(
            key(None, JwtAlg::ES256, None, Some(pem)).map_err(|e| format!("es256_public_key_pem {e}"))?,
        );
    }
    for (i, k) in cfg.keys.iter().enumerate() {
        let name = match &k.kid {
            Some(kid) => format!("keys[{i}] (kid `{kid}`)"),
            None => format!("keys[{i}]"),
        };
        if let Some(kid) = &k.kid {
            if kid.is_empty() {
                return Err(format!("{name}: `kid` must not be empty"));
            }
            if cfg.keys[..i].iter().any(|o| o.kid.as_deref() == Some(kid)) {
                return Err(format!("{name}: another key has the same `kid`"));
            }
        }
        let made = key(k.kid.clone(), k.alg, k.secret.as_deref(), k.public_key_pem.as_deref());
        keys.push(made.map_err(|e| format!("{name}: {e}"))?);
    }
    Ok(keys)
}

/// A key of `alg` from its secret (HS256) or public key PEM (the others).
fn key(kid: Option<String>, alg: JwtAlg, secret: Option<&str>, pem: Option<&str>) -> Result<Key, String> {
    let key = match (alg, secret, pem) {
        (JwtAlg::HS256, Some(s), None) if s.len() >= MIN_SECRET_BYTES => {
            DecodingKey::from_secret(s.as_bytes())
        }
        (JwtAlg::HS256, Some(_), None) => return Err(format!("must be at least {MIN_SECRET_BYTES} bytes")),
        (JwtAlg::HS256, _, _) => return Err("HS256 takes a `secret` (and no `public_key_pem`)".into()),
        (_, None, Some(pem)) => {
            let parsed = match alg {
                JwtAlg::RS256 => DecodingKey::from_rsa_pem(pem.as_bytes()),
                JwtAlg::ES256 => DecodingKey::from_ec_pem(pem.as_bytes()),
                _ => DecodingKey::from_ed_pem(pem.as_bytes()),
            };
            parsed.map_err(|e| format!("is not a {alg:?} public key: {e}"))?
        }
        _ => return Err(format!("{alg:?} takes a `public_key_pem` (and no `secret`)")),
    };
    Ok(Key { kid, alg: alg.into(), key })
}

/// Why no key verified a token.
enum Failure {
    /// Refused for good.
    Refused(AuthError),
    /// No key of the token's `alg` and `kid` is known: a JWKS refresh may
    /// bring it.
    NoKey,
}

/// Verifies client JWTs (see the module docs). Rebuilt on a reload; the
/// JWKS it holds is kept across reloads that keep `jwks_url`.
pub struct JwtVerifier {
    keys: Vec<Key>,
    jwks: Option<Arc<Jwks>>,
    validation: Validation,
}

impl JwtVerifier {
    /// The static keys and claim checks of `cfg`, checked; `jwks_url` is
    /// checked here but fetched only by a [`Jwks`] given to
    /// [`JwtVerifier::with_jwks`].
    pub fn new(cfg: &JwtConfig) -> Result<Self, String> {
        let keys = static_keys(cfg)?;
        if let Some(url) = &cfg.jwks_url {
            super::check_jwks_url(url).map_err(|e| format!("jwks_url: {e}"))?;
        }
        if cfg.jwks_refresh_min < std::time::Duration::from_millis(100)
            || cfg.jwks_refresh_max < cfg.jwks_refresh_min
        {
            return Err(
                "jwks_refresh_min must be at least 100ms and jwks_refresh_max at least as long".into()
            );
        }
        // The algorithms are set per key at verification; this holds the
        // claim checks every key shares.
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = cfg.leeway_secs;
        validation.validate_nbf = true;
        validation.validate_exp = true;
        let mut required = vec!["exp", "sub"];
        if cfg.issuers.is_empty() {
            validation.iss = None;
        } else {
            validation.set_issuer(&cfg.issuers);
            required.push("iss");
        }
        if cfg.audiences.is_empty() {
            validation.validate_aud = false;
        } else {
            validation.set_audience(&cfg.audiences);
            required.push("aud");
        }
        validation.set_required_spec_claims(&required);
        Ok(Self { keys, jwks: None, validation })
    }

    /// The same verifier, also trusting the keys `jwks` holds.
    pub fn with_jwks(mut self, jwks: Arc<Jwks>) -> Self {
        self.jwks = Some(jwks);
        self
    }

    /// The JWKS this verifier trusts, if any.
    pub fn jwks(&self) -> Option<&Arc<Jwks>> {
        self.jwks.as_ref()
    }

    pub fn is_configured(&self) -> bool {
        !self.keys.is_empty() || self.jwks.is_some()
    }

    /// Verify `token`; `device_param` is the connection's `?device=`
    /// (a `device` claim wins over it). A token whose key is not known
    /// yet waits for one JWKS refresh (bounded by its timeout) unless one
    /// ran less than `jwks_refresh_min` ago.
    pub async fn verify(&self, token: &str, device_param: Option<&str>) -> Result<Identity, AuthError> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| AuthError::new(ErrorCode::Unauthorized, "malformed token or unsupported alg"))?;
        let fetched = self.jwks.as_ref().map(|j| j.keys());
        let first = self.verify_with(fetched.as_deref().map_or(&[], Vec::as_slice), &header, token);
        let claims = match (first, &self.jwks, &fetched) {
            (Ok(c), _, _) => c,
            (Err(Failure::NoKey), Some(jwks), Some(seen)) if jwks.refresh_for_unknown_key(seen).await => {
                match self.verify_with(&jwks.keys(), &header, token) {
                    Ok(c) => c,
                    Err(Failure::Refused(e)) => return Err(e),
                    Err(Failure::NoKey) => return Err(no_key()),
                }
            }
            (Err(Failure::Refused(e)), _, _) => return Err(e),
            (Err(Failure::NoKey), _, _) => return Err(no_key()),
        };
        identity_from(claims, device_param)
    }

    /// Check `token` with the static keys and `fetched` (see the module
    /// docs for which keys are tried).
    fn verify_with(
        &self,
        fetched: &[Key],
        header: &jsonwebtoken::Header,
        token: &str,
    ) -> Result<Claims, Failure> {
        if !matches!(header.alg, Algorithm::HS256 | Algorithm::RS256 | Algorithm::ES256 | Algorithm::EdDSA) {
            return Err(Failure::Refused(AuthError::new(
                ErrorCode::Unauthorized,
                "token algorithm not accepted",
            )));
        }
        let kid = header.kid.as_deref();
        let of_alg = || self.keys.iter().chain(fetched).filter(|k| k.alg == header.alg);
        let named = kid.is_some_and(|kid| of_alg().any(|k| k.kid.as_deref() == Some(kid)));
        let eligible = |k: &&Key| match kid {
            None => true,
            Some(kid) if named => k.kid.as_deref() == Some(kid),
            Some(_) => k.kid.is_none(),
        };
        for k in of_alg().filter(eligible) {
            let mut validation = self.validation.clone();
            validation.algorithms = vec![k.alg];
            match jsonwebtoken::decode::<Claims>(token, &k.key, &validation) {
                Ok(data) => return Ok(data.claims),
                // Another key may have signed it.
                Err(e) if matches!(e.kind(), ErrorKind::InvalidSignature) => {}
                Err(e) => return Err(Failure::Refused(refusal(e.kind()))),
            }
        }
        // A `kid` no key has: the JWKS may not have it yet.
        if kid.is_some() && !named || of_alg().next().is_none() {
            return Err(Failure::NoKey);
        }
        Err(Failure::Refused(AuthError::new(ErrorCode::Unauthorized, "bad token signature")))
    }
}

fn no_key() -> AuthError {
    AuthError::new(ErrorCode::Unauthorized, "no key for the token's `alg` and `kid`")
}

fn refusal(kind: &ErrorKind) -> AuthError {
    let unauthorized = |m| AuthError::new(ErrorCode::Unauthorized, m);
    match kind {
        ErrorKind::ExpiredSignature => AuthError::new(ErrorCode::TokenExpired, "token expired"),
        ErrorKind::ImmatureSignature => unauthorized("token not valid yet (nbf)"),
        ErrorKind::InvalidSignature => unauthorized("bad token signature"),
        ErrorKind::InvalidIssuer => unauthorized("token `iss` not accepted"),
        ErrorKind::InvalidAudience => unauthorized("token `aud` not accepted"),
        ErrorKind::MissingRequiredClaim(_) => {
            unauthorized("token lacks a required claim (exp, sub, and iss, aud when configured)")
        }
        _ => unauthorized("invalid token"),
    }
}

#[cfg(test)]
mod tests;
