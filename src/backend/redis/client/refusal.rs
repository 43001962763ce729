//! A server's error reply, typed by its first word: what the client
//! follows itself (redirections) and what the backend decides on (a value
//! of the wrong type, a counter that is not one), so no caller matches on
//! the reply's text.

use super::routes::Redirection;

/// What a server's error reply to one command says.
#[derive(Clone, Debug, PartialEq)]
pub(in crate::backend::redis) enum Problem {
    /// MOVED, ASK, TRYAGAIN or CLUSTERDOWN: `job` sends the command again.
    Redirected(Redirection),
    /// WRONGTYPE: the key holds a value of another type.
    WrongType,
    /// INCR and the like on a value that is no integer (or out of range).
    NotAnInteger,
    /// LOADING: the server is loading its dataset into memory.
    Loading,
    /// Anything else (`ERR ...`, `OOM ...`, ...).
    Other,
}

/// A server's error reply: its kind and its text (for messages).
#[derive(Clone, Debug, PartialEq)]
pub(in crate::backend::redis) struct ServerError {
    pub(in crate::backend::redis) problem: Problem,
    pub(in crate::backend::redis) message: String,
}

impl ServerError {
    pub(in crate::backend::redis) fn new(message: String) -> ServerError {
        ServerError {
            problem: Problem::of(&message),
            message,
        }
    }
}

impl Problem {
    /// The problem an error reply's text names.
    pub(in crate::backend::redis) fn of(message: &str) -> Problem {
        let mut words = message.split(' ');
        let code = words.next().unwrap_or("");
        let mut address = || {
            let (host, port) = words.nth(1)?.rsplit_once(':')?;
            let port = port.parse::<u16>().ok()?;
            (!host.is_empty()).then(|| (host.to_string(), port))
        };
        match code {
            "MOVED" => Problem::Redirected(Redirection::Moved(address())),
            "ASK" => Problem::Redirected(Redirection::Ask(address())),
            "TRYAGAIN" | "CLUSTERDOWN" => Problem::Redirected(Redirection::TryAgain),
            "WRONGTYPE" => Problem::WrongType,
            "LOADING" => Problem::Loading,
            // Redis and Valkey: "ERR value is not an integer or out of range".
            "ERR" if message.contains("not an integer") => Problem::NotAnInteger,
            _ => Problem::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redirection(message: &str) -> Option<Redirection> {
        match Problem::of(message) {
            Problem::Redirected(how) => Some(how),
            _ => None,
        }
    }

    #[test]
    fn redirections_are_told_from_other_errors() {
        let at = Some(("127.0.0.1".to_string(), 6381));
        assert_eq!(
            redirection("MOVED 3999 127.0.0.1:6381"),
            Some(Redirection::Moved(at.clone()))
        );
        assert_eq!(
            redirection("ASK 3999 127.0.0.1:6381"),
            Some(Redirection::Ask(at))
        );
        assert_eq!(
            redirection("MOVED 3999 :6381"),
            Some(Redirection::Moved(None))
        );
        assert_eq!(
            redirection("TRYAGAIN Multiple keys request during rehashing of slot"),
            Some(Redirection::TryAgain)
        );
        assert_eq!(
            redirection("CLUSTERDOWN The cluster is down"),
            Some(Redirection::TryAgain)
        );
        assert_eq!(redirection("MOVEDX"), None);
        assert_eq!(redirection("WRONGTYPE Operation"), None);
    }

    #[test]
    fn server_problems_are_typed_by_their_first_word() {
        let of = Problem::of;
        assert_eq!(
            of("WRONGTYPE Operation against a key holding the wrong kind of value"),
            Problem::WrongType
        );
        assert_eq!(
            of("ERR value is not an integer or out of range"),
            Problem::NotAnInteger
        );
        assert_eq!(
            of("LOADING Redis is loading the dataset in memory"),
            Problem::Loading
        );
        assert_eq!(of("ERR unknown command 'FOO'"), Problem::Other);
        assert_eq!(of("OOM command not allowed"), Problem::Other);
        // The word, not a prefix of it.
        assert_eq!(of("WRONGTYPEX"), Problem::Other);
        let e = ServerError::new("WRONGTYPE x".into());
        assert_eq!(
            (e.problem, e.message.as_str()),
            (Problem::WrongType, "WRONGTYPE x")
        );
    }
}
