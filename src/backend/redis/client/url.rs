//! Server URLs: `redis://[user[:password]@]host[:port][/db]` and the same
//! with `rediss://` (TLS), parsed into what a connection needs, with a
//! message that says what is wrong (the caller redacts the password).

/// One server as a URL names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::backend::redis) struct Endpoint {
    pub host: String,
    pub port: u16,
    /// `rediss://`: TLS, the certificate checked against `host`.
    pub tls: bool,
    pub user: Option<String>,
    pub password: Option<String>,
    pub db: i64,
}

impl Endpoint {
    /// The same server settings at another address (a cluster's nodes).
    pub(in crate::backend::redis) fn at(&self, host: &str, port: u16) -> Endpoint {
        Endpoint {
            host: host.to_string(),
            port,
            ..self.clone()
        }
    }
}

/// Percent-decoding of a URL's user or password (`%40` is `@`).
fn decode(part: &str) -> Result<String, String> {
    let bytes = part.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = part
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or("a bad %-escape in the user or password")?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "a user or password that is not UTF-8".to_string())
}

/// Parses a `redis://` or `rediss://` URL.
pub(in crate::backend::redis) fn parse(url: &str) -> Result<Endpoint, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or("no scheme (redis:// or rediss://)")?;
    let tls = match scheme {
        "redis" => false,
        "rediss" => true,
        "unix" | "redis+unix" => {
            return Err(format!(
                "scheme {scheme}://: Unix sockets are not supported (redis:// or rediss:// \
                 only; serve a local Redis on loopback TCP)"
            ))
        }
        other => return Err(format!("scheme {other}:// (redis:// or rediss:// only)")),
    };
    let (rest, fragment) = match rest.split_once('#') {
        Some((rest, fragment)) => (rest, Some(fragment)),
        None => (rest, None),
    };
    match fragment {
        None | Some("") => {}
        Some("insecure") => {
            return Err(
                "#insecure is refused: kvtier always verifies the server's certificate".into(),
            )
        }
        Some(other) => return Err(format!("an unknown fragment #{other}")),
    }
    if rest.contains('?') {
        return Err("query parameters are not supported (the db goes in the path: /N)".into());
    }
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((userinfo, hostport)) => (Some(userinfo), hostport),
        None => (None, authority),
    };
    let (user, password) = match userinfo {
        None => (None, None),
        Some(info) => {
            let (user, password) = match info.split_once(':') {
                Some((user, password)) => (user, Some(password)),
                None => (info, None),
            };
            let user = (!user.is_empty()).then(|| decode(user)).transpose()?;
            // `redis://secret@host`: a lone userinfo is the password, as
            // the redis crate reads it.
            match password {
                Some(password) => (user, Some(decode(password)?)),
                None => (None, user),
            }
        }
    };
    let (host, port) = if let Some(bracketed) = hostport.strip_prefix('[') {
        let (host, after) = bracketed
            .split_once(']')
            .ok_or("an IPv6 address without its closing ]")?;
        (host, after.strip_prefix(':'))
    } else {
        match hostport.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (hostport, None),
        }
    };
    if host.is_empty() {
        return Err("no host".into());
    }
    let port = match port {
        None | Some("") => 6379,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|&p| p > 0)
            .ok_or_else(|| format!("port {port:?} is not a port number"))?,
    };
    let db = match path.trim_start_matches('/') {
        "" => 0,
        db => db
            .parse::<i64>()
            .ok()
            .filter(|&n| n >= 0)
            .ok_or_else(|| format!("database {db:?} is not a number"))?,
    };
    Ok(Endpoint {
        host: host.to_string(),
        port,
        tls,
        user,
        password,
        db,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(url: &str) -> Endpoint {
        parse(url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    #[test]
    fn urls_name_host_port_user_password_and_db() {
        let e = ok("redis://127.0.0.1:7000");
        assert_eq!(
            (e.host.as_str(), e.port, e.tls, e.db),
            ("127.0.0.1", 7000, false, 0)
        );
        assert_eq!((e.user, e.password), (None, None));
        let e = ok("rediss://alice:p%40ss@cache.local/3");
        assert_eq!(
            (e.host.as_str(), e.port, e.tls, e.db),
            ("cache.local", 6379, true, 3)
        );
        assert_eq!(e.user.as_deref(), Some("alice"));
        assert_eq!(e.password.as_deref(), Some("p@ss"));
        let e = ok("redis://:secret@[::1]:6380/");
        assert_eq!((e.host.as_str(), e.port), ("::1", 6380));
        assert_eq!((e.user, e.password.as_deref()), (None, Some("secret")));
        assert_eq!(ok("redis://secret@h").password.as_deref(), Some("secret"));
        assert_eq!(ok("redis://h:1").at("g", 2), ok("redis://g:2"));
    }

    #[test]
    fn unusable_urls_say_why() {
        for (url, why) in [
            ("127.0.0.1:6379", "no scheme"),
            ("http://h", "redis:// or rediss:// only"),
            ("unix:///run/redis.sock", "Unix sockets are not supported"),
            ("redis+unix:///run/redis.sock", "loopback TCP"),
            ("redis://h:port", "not a port number"),
            ("redis://h:0", "not a port number"),
            ("redis://h/x", "not a number"),
            ("redis://", "no host"),
            ("rediss://h#insecure", "insecure"),
            ("redis://h?protocol=resp3", "query"),
            ("redis://[::1", "closing ]"),
            ("redis://a:%zz@h", "%-escape"),
        ] {
            let e = parse(url).expect_err(url);
            assert!(e.contains(why), "{url}: {e}");
        }
    }
}
