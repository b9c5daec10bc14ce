//! `TokenReview` (authentication.k8s.io/v1) and `SubjectAccessReview`
//! (authorization.k8s.io/v1) as the API server answers them: a create that
//! stores nothing and returns the object with its `status` filled in. Known
//! tokens and the non-resource URLs each user may use are set by the test;
//! an unknown token is not authenticated, an ungranted request not allowed.

use std::collections::{HashMap, HashSet};

use serde_json::{Value, json};

/// Who the fake API server knows, and what they may do.
#[derive(Default)]
pub struct Reviews {
    /// token → (username, groups)
    tokens: HashMap<String, (String, Vec<String>)>,
    /// (username, non-resource path, verb)
    grants: HashSet<(String, String, String)>,
}

impl Reviews {
    pub fn add_token(&mut self, token: &str, user: &str, groups: &[&str]) {
        self.tokens.insert(
            token.to_owned(),
            (user.to_owned(), groups.iter().map(|g| (*g).to_owned()).collect()),
        );
    }

    pub fn grant_non_resource(&mut self, user: &str, path: &str, verb: &str) {
        self.grants
            .insert((user.to_owned(), path.to_owned(), verb.to_owned()));
    }

    /// The answer to a TokenReview `body`.
    pub fn token_review(&self, body: &Value) -> Value {
        let token = body
            .pointer("/spec/token")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let status = match self.tokens.get(token) {
            Some((user, groups)) => {
                json!({"authenticated": true, "user": {"username": user, "groups": groups}})
            }
            None => json!({"authenticated": false, "error": "invalid bearer token"}),
        };
        answered(body, "TokenReview", "authentication.k8s.io/v1", status)
    }

    /// The answer to a SubjectAccessReview `body` (non-resource requests;
    /// resource requests are never allowed here).
    pub fn subject_access_review(&self, body: &Value) -> Value {
        let user = body
            .pointer("/spec/user")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let path = body
            .pointer("/spec/nonResourceAttributes/path")
            .and_then(Value::as_str);
        let verb = body
            .pointer("/spec/nonResourceAttributes/verb")
            .and_then(Value::as_str);
        let allowed = match (path, verb) {
            (Some(path), Some(verb)) => {
                self.grants
                    .contains(&(user.to_owned(), path.to_owned(), verb.to_owned()))
            }
            _ => false,
        };
        let status = if allowed {
            json!({"allowed": true, "reason": "granted by the test"})
        } else {
            json!({"allowed": false})
        };
        answered(body, "SubjectAccessReview", "authorization.k8s.io/v1", status)
    }
}

fn answered(body: &Value, kind: &str, api_version: &str, status: Value) -> Value {
    let mut out = body.clone();
    out["kind"] = json!(kind);
    out["apiVersion"] = json!(api_version);
    out["status"] = status;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_authenticate_and_only_grants_allow() {
        let mut r = Reviews::default();
        r.add_token(
            "t1",
            "system:serviceaccount:monitoring:prometheus",
            &["system:serviceaccounts"],
        );
        r.grant_non_resource("system:serviceaccount:monitoring:prometheus", "/metrics", "get");
        let known = r.token_review(&json!({"spec": {"token": "t1"}}));
        assert_eq!(known["status"]["authenticated"], true);
        assert_eq!(
            known["status"]["user"]["username"],
            "system:serviceaccount:monitoring:prometheus"
        );
        assert_eq!(
            r.token_review(&json!({"spec": {"token": "t2"}}))["status"]["authenticated"],
            false
        );
        let sar = |user: &str, path: &str, verb: &str| {
            r.subject_access_review(&json!({"spec": {"user": user,
                "nonResourceAttributes": {"path": path, "verb": verb}}}))["status"]["allowed"]
                .clone()
        };
        assert_eq!(
            sar("system:serviceaccount:monitoring:prometheus", "/metrics", "get"),
            true
        );
        assert_eq!(
            sar("system:serviceaccount:monitoring:prometheus", "/metrics", "post"),
            false
        );
        assert_eq!(sar("someone", "/metrics", "get"), false);
    }
}
