//! The `Host` header as RFC 9112 3.2 requires it, which hyper leaves to the server: "A server
//! MUST respond with a 400 (Bad Request) status code to any HTTP/1.1 request message that
//! lacks a Host header field and to any request message that contains more than one Host
//! header field line or a Host header field with an invalid field value."
//!
//! Checked in the accept loop rather than in the app: the app also serves requests built in
//! process (tests, the fuzzer), which carry no `Host`, and the rule is one of HTTP/1.1's wire
//! format, like the heads hyper refuses ([`super::hyper_answers`]). gRPC's HTTP/2 names the
//! authority in `:authority` and never comes through here.

use axum::http::{header, HeaderValue, Request, Version};
use axum::response::Response;

use crate::metrics::Metrics;
use crate::service::ApiError;
use crate::transport::http::body::closing;

/// The answer to `request` when its `Host` header is refused: 400 `invalid_host`, counted,
/// and the connection closed after it (its body, if any, is left unread).
pub(super) fn refusal<B>(request: &Request<B>, metrics: &Metrics) -> Option<Response> {
    let error = invalid_host(request)?;
    metrics.record_error(error.error_type());
    let mut response = closing(error);
    response.headers_mut().insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    Some(response)
}

fn invalid_host<B>(request: &Request<B>) -> Option<ApiError> {
    let mut hosts = request.headers().get_all(header::HOST).iter();
    let message = match (hosts.next(), hosts.next()) {
        (None, _) if request.version() < Version::HTTP_11 => return None,
        (None, _) => "an HTTP/1.1 request must have a Host header",
        (Some(_), Some(_)) => "the request has more than one Host header",
        (Some(host), None) if is_host(host.as_bytes()) => return None,
        (Some(_), None) => "the Host header is not a host name or address with an optional port",
    };
    Some(ApiError::InvalidHost(format!("{message} (RFC 9112 3.2)")))
}

/// Whether `value` is `uri-host [ ":" port ]` of RFC 3986, what RFC 9110 7.2 makes a Host
/// value. Empty is allowed: it is what a client sends for a target URI without an authority.
fn is_host(value: &[u8]) -> bool {
    let (host, rest) = match value.strip_prefix(b"[") {
        Some(literal) => match literal.iter().position(|&b| b == b']') {
            Some(end) => (is_ip_literal(&literal[..end]), &literal[end + 1..]),
            None => return false,
        },
        None => {
            let end = value.iter().position(|&b| b == b':').unwrap_or(value.len());
            (is_reg_name(&value[..end]), &value[end..])
        }
    };
    host && match rest {
        [] => true,
        [b':', port @ ..] => port.iter().all(u8::is_ascii_digit),
        _ => false,
    }
}

/// A host name or IPv4 address: `*( unreserved / pct-encoded / sub-delims )`.
fn is_reg_name(name: &[u8]) -> bool {
    let mut i = 0;
    while i < name.len() {
        let pct_encoded = name[i] == b'%'
            && name
                .get(i + 1..i + 3)
                .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit));
        if pct_encoded {
            i += 3;
        } else if is_unreserved(name[i]) || is_sub_delim(name[i]) {
            i += 1;
        } else {
            return false;
        }
    }
    true
}

/// Within the brackets: an IPv6 address, or `IPvFuture` (`v` HEXDIG+ `.` followed by
/// unreserved, sub-delims or `:`).
fn is_ip_literal(inside: &[u8]) -> bool {
    if let Some(future) = inside.strip_prefix(b"v").or(inside.strip_prefix(b"V")) {
        let Some(dot) = future.iter().position(|&b| b == b'.') else {
            return false;
        };
        let (version, address) = (&future[..dot], &future[dot + 1..]);
        return !version.is_empty()
            && version.iter().all(u8::is_ascii_hexdigit)
            && !address.is_empty()
            && address
                .iter()
                .all(|&b| is_unreserved(b) || is_sub_delim(b) || b == b':');
    }
    std::str::from_utf8(inside).is_ok_and(|s| s.parse::<std::net::Ipv6Addr>().is_ok())
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn is_sub_delim(b: u8) -> bool {
    matches!(
        b,
        b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'='
    )
}

#[cfg(test)]
mod tests {
    use super::is_host;

    #[test]
    fn host_values_follow_rfc_3986() {
        for valid in [
            "",
            "a.test",
            "a.test:8080",
            "a.test:",
            "127.0.0.1:80",
            "[::1]",
            "[::1]:8080",
            "[::ffff:192.0.2.1]",
            "[v1.fe80::a+en1]",
            "xn--bcher-kva.example",
            "a%2Eb",
            "a!$&'()*+,;=b",
        ] {
            assert!(is_host(valid.as_bytes()), "{valid:?} is valid");
        }
        for invalid in [
            "a b",
            "a.test/x",
            "a.test?x",
            "user@a.test",
            "a.test:http",
            "a.test:80:80",
            "[::1",
            "[::1]x",
            "[a.test]",
            "[v.x]",
            "[v1.]",
            "a%2",
            "a%zz",
            "b\u{fc}cher.example",
        ] {
            assert!(!is_host(invalid.as_bytes()), "{invalid:?} is invalid");
        }
    }
}
