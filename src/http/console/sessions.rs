//! The console's sessions, kept by the server: the cookie holds a random
//! session id, never the token, which stays in this process from the login
//! request on. A session ends at logout, after [`IDLE`] without a request
//! or [`LIFETIME`] after login, and (checked on every request) when a
//! reload of the credentials revokes its token. Sessions live in the
//! replica that logged them in.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// A session unused this long has ended.
pub(super) const IDLE: Duration = Duration::from_secs(30 * 60);
/// A session has ended this long after its login, however used.
pub(super) const LIFETIME: Duration = Duration::from_secs(12 * 60 * 60);
/// Sessions kept at most; past it, the least recently used one ends.
const MAX_SESSIONS: usize = 1_000;

/// A session as the server keeps it.
#[derive(Clone)]
pub(super) struct Kept {
    /// The admin token, for the console's Coordinator calls; `None` when
    /// the server runs without credentials.
    pub token: Option<String>,
    /// The operator's own name, recorded with actions.
    pub operator: String,
    /// What the session's forms must carry back.
    pub csrf: String,
    /// When the session was opened, for [`LIFETIME`].
    created: Instant,
    /// When it was last used, for [`IDLE`].
    last_seen: Instant,
}

impl Kept {
    fn ended(&self, now: Instant) -> bool {
        now.duration_since(self.created) >= LIFETIME || now.duration_since(self.last_seen) >= IDLE
    }
}

/// The open sessions, by the SHA-256 of their id (a lookup's timing says
/// nothing of the ids).
#[derive(Default)]
pub(super) struct Sessions(Mutex<HashMap<[u8; 32], Kept>>);

/// 244 random bits, as 64 hex digits: a session id or a CSRF token.
pub(super) fn random_secret() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

fn key(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Kept>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens a session; its id, for the cookie.
    pub(super) fn open(&self, token: Option<String>, operator: String) -> String {
        let id = random_secret();
        let now = Instant::now();
        let mut sessions = self.lock();
        if sessions.len() >= MAX_SESSIONS {
            sessions.retain(|_, kept| !kept.ended(now));
        }
        if sessions.len() >= MAX_SESSIONS {
            let oldest = sessions
                .iter()
                .min_by_key(|(_, kept)| kept.last_seen)
                .map(|(k, _)| *k);
            if let Some(oldest) = oldest {
                sessions.remove(&oldest);
            }
        }
        sessions.insert(
            key(&id),
            Kept {
                token,
                operator,
                csrf: random_secret(),
                created: now,
                last_seen: now,
            },
        );
        id
    }

    /// The session of `id`, if open: its use is recorded.
    pub(super) fn find(&self, id: &str) -> Option<Kept> {
        let now = Instant::now();
        let mut sessions = self.lock();
        let key = key(id);
        let kept = sessions.get_mut(&key)?;
        if kept.ended(now) {
            sessions.remove(&key);
            return None;
        }
        kept.last_seen = now;
        Some(kept.clone())
    }

    /// Ends the session of `id`.
    pub(super) fn close(&self, id: &str) {
        self.lock().remove(&key(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_found_by_its_id_until_closed() {
        let sessions = Sessions::default();
        let id = sessions.open(Some("token".into()), "Ada".into());
        assert_eq!(id.len(), 64);
        let kept = sessions.find(&id).expect("open");
        assert_eq!(
            (kept.token.as_deref(), kept.operator.as_str()),
            (Some("token"), "Ada")
        );
        assert!(sessions.find(&random_secret()).is_none());
        sessions.close(&id);
        assert!(sessions.find(&id).is_none());
    }

    #[test]
    fn at_most_max_sessions_are_kept() {
        let sessions = Sessions::default();
        let first = sessions.open(None, String::new());
        for _ in 0..MAX_SESSIONS {
            sessions.open(None, String::new());
        }
        assert_eq!(sessions.lock().len(), MAX_SESSIONS);
        assert!(
            sessions.find(&first).is_none(),
            "the least recently used ended"
        );
    }
}
