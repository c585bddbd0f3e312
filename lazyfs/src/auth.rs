//! Registry credentials: the answer to a 401. A registry names its scheme in WWW-Authenticate:
//! Basic (the node's user and password, sent as they are) or Bearer (a token from the realm it
//! names, asked for with those credentials). Tokens expire (minutes, typically) while a mount
//! serves for hours, so the store asks again whenever the registry answers 401.
//!
//! Where the credentials come from: COLDSTART_REGISTRY_USER / COLDSTART_REGISTRY_PASSWORD, and
//! COLDSTART_LAZYFS_AUTH for the Authorization header the Python side already obtained (the
//! environment, not argv, so that no token shows in `ps`).

use std::collections::HashMap;

use base64::Engine;

#[derive(Clone)]
pub struct Creds {
    pub user: String,
    pub password: String,
}

impl Creds {
    pub fn from_env() -> Option<Creds> {
        let user = std::env::var("COLDSTART_REGISTRY_USER").ok().filter(|u| !u.is_empty())?;
        let password = std::env::var("COLDSTART_REGISTRY_PASSWORD").unwrap_or_default();
        Some(Creds { user, password })
    }

    fn basic(&self) -> String {
        let raw = format!("{}:{}", self.user, self.password);
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(raw))
    }
}

/// The Authorization header that answers `challenge` (a WWW-Authenticate value) for pulls of `repo`.
pub fn answer(http: &ureq::Agent, challenge: &str, creds: Option<&Creds>, repo: &str) -> Result<String, String> {
    let (scheme, rest) = challenge.trim().split_once(' ').unwrap_or((challenge.trim(), ""));
    match scheme.to_ascii_lowercase().as_str() {
        "basic" => creds.map(Creds::basic).ok_or_else(|| {
            "the registry needs credentials (401, Basic): set COLDSTART_REGISTRY_USER and \
             COLDSTART_REGISTRY_PASSWORD"
                .to_string()
        }),
        "bearer" => bearer(http, &params(rest), creds, repo),
        _ => Err(format!("the registry asks for unknown authentication {challenge:?}")),
    }
}

fn bearer(
    http: &ureq::Agent,
    p: &HashMap<String, String>,
    creds: Option<&Creds>,
    repo: &str,
) -> Result<String, String> {
    let realm = p.get("realm").ok_or("the registry's Bearer challenge has no realm")?;
    let scope = p.get("scope").cloned().unwrap_or_else(|| format!("repository:{repo}:pull"));
    let mut req = http.get(realm).query("scope", &scope);
    if let Some(service) = p.get("service") {
        req = req.query("service", service);
    }
    if let Some(c) = creds {
        req = req.header("Authorization", c.basic());
    }
    let mut resp = req.call().map_err(|e| format!("token service {realm} unreachable: {e}"))?;
    let status = resp.status().as_u16();
    let body = resp.body_mut().with_config().limit(1 << 20).read_to_string().unwrap_or_default();
    if status != 200 {
        let short: String = body.chars().take(160).collect();
        return Err(format!("token service {realm} answered HTTP {status} {}", short.trim()));
    }
    let v: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| format!("token service {realm}: malformed answer: {e}"))?;
    let token = v.get("token").or_else(|| v.get("access_token")).and_then(|t| t.as_str());
    token
        .filter(|t| !t.is_empty())
        .map(|t| format!("Bearer {t}"))
        .ok_or_else(|| format!("token service {realm} returned no token"))
}

/// `key="value"` pairs of a challenge; values may hold commas (`scope="repository:a:pull,push"`).
fn params(s: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut rest = s.trim();
    while let Some(eq) = rest.find('=') {
        let key = rest[..eq].trim().trim_start_matches(',').trim().to_ascii_lowercase();
        let after = &rest[eq + 1..];
        let (value, next) = if let Some(q) = after.strip_prefix('"') {
            match q.find('"') {
                Some(end) => (&q[..end], &q[end + 1..]),
                None => (q, ""),
            }
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (after[..end].trim(), &after[end..])
        };
        out.insert(key, value.to_string());
        rest = next.trim_start().trim_start_matches(',');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::params;

    #[test]
    fn challenge_params_keep_commas_inside_quotes() {
        let p = params(r#"realm="https://auth.example/token",service="registry",scope="repository:a/b:pull,push""#);
        assert_eq!(p["realm"], "https://auth.example/token");
        assert_eq!(p["service"], "registry");
        assert_eq!(p["scope"], "repository:a/b:pull,push");
        assert_eq!(params("realm=x, error=invalid_token")["error"], "invalid_token");
    }
}
