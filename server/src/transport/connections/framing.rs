//! Where each request ends in the bytes a connection has read, so that the wait for the next
//! head can tell whether hyper already holds the start of it.
//!
//! hyper reads whatever the socket has, which may run past the request it is parsing: a client
//! that pipelines sends the next request, or the start of it, in the same write. Those bytes
//! wait in hyper's buffer, where the head timer never sees them arrive, so a half head sent that
//! way was given the keep-alive timeout (75 s) instead of the header timeout. [`Framing`]
//! follows the stream as hyper parses it: a head ends at its first empty line (httparse's rule:
//! lines end in CRLF or LF, and empty lines before the request line are skipped), and its body
//! is as long as hyper says when it hands the request over. A chunked body's length is not
//! known until hyper has decoded it, out of sight, so after one the next wait is taken to start
//! on an empty buffer, as before.

/// How far a connection's bytes have been followed.
#[derive(Debug, Default)]
pub(super) struct Framing {
    state: State,
    /// Bytes read past a head that hyper has not handed over yet: its body, or later requests.
    held: Vec<u8>,
}

#[derive(Debug)]
enum State {
    /// In a head, or before it.
    Head(Line),
    /// A head has ended; what follows waits in `held` until its body's length is known.
    HeadEnded,
    /// In a body, with this many of its bytes still to come.
    Body(u64),
    /// Not followed: after a body of unknown length, or past [`MAX_HELD`] bytes held.
    Lost,
}

impl Default for State {
    fn default() -> Self {
        State::Head(Line::Leading)
    }
}

/// Where a head scan is in the line it is reading.
#[derive(Debug, Clone, Copy)]
enum Line {
    /// Before the request line: nothing but empty lines yet.
    Leading,
    Within,
    /// Just after a line's LF.
    Start,
    /// After a line's LF and a CR.
    StartCr,
}

/// More bytes than this read past a head before hyper hands it over are not followed (hyper
/// reads 8 KiB at first and grows from there; a head and its body rarely fill this).
const MAX_HELD: usize = 64 * 1024;

impl Framing {
    /// Follows `bytes`, just read from the socket.
    pub(super) fn read(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            match &mut self.state {
                State::Head(line) => match head_end(line, bytes) {
                    Some(end) => {
                        self.state = State::HeadEnded;
                        bytes = &bytes[end..];
                    }
                    None => return,
                },
                State::HeadEnded => {
                    if self.held.len() + bytes.len() > MAX_HELD {
                        self.state = State::Lost;
                        self.held = Vec::new();
                    } else {
                        self.held.extend_from_slice(bytes);
                    }
                    return;
                }
                State::Body(left) => {
                    let taken = usize::try_from(*left).map_or(bytes.len(), |l| l.min(bytes.len()));
                    *left -= taken as u64;
                    bytes = &bytes[taken..];
                    if *left == 0 {
                        self.state = State::default();
                    }
                }
                State::Lost => return,
            }
        }
    }

    /// hyper has parsed a head and handed its request over, with a body of `length` bytes
    /// (`None`: not known until decoded, as a chunked body).
    pub(super) fn request(&mut self, length: Option<u64>) {
        self.state = match (&self.state, length) {
            (State::HeadEnded, Some(0)) => State::default(),
            (State::HeadEnded, Some(length)) => State::Body(length),
            // Chunked, or hyper found a head where this scan did not: nothing to go by.
            _ => State::Lost,
        };
        let held = std::mem::take(&mut self.held);
        self.read(&held);
    }

    /// hyper starts waiting for a head: whether it already holds bytes of it (empty lines do
    /// not count). Where the stream was not followed, or hyper is done with a body this scan
    /// still counts on (a body left unread after `Expect: 100-continue` is never sent), the
    /// wait is taken to start on an empty buffer, and the scan starts over from here.
    pub(super) fn head_started(&mut self) -> bool {
        match self.state {
            State::Head(Line::Leading) => false,
            State::Head(_) | State::HeadEnded => true,
            State::Body(_) | State::Lost => {
                self.state = State::default();
                self.held = Vec::new();
                false
            }
        }
    }
}

/// Reads `bytes` on from `line`; where the head ends in them (just past its empty line), if it
/// does.
fn head_end(line: &mut Line, bytes: &[u8]) -> Option<usize> {
    for (i, &byte) in bytes.iter().enumerate() {
        *line = match (*line, byte) {
            (Line::Leading, b'\r' | b'\n') => Line::Leading,
            (Line::Start | Line::StartCr, b'\n') => return Some(i + 1),
            (Line::Start, b'\r') => Line::StartCr,
            (_, b'\n') => Line::Start,
            _ => Line::Within,
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const GET: &[u8] = b"GET /health HTTP/1.1\r\nHost: a\r\n\r\n";
    const POST: &[u8] = b"POST /translate HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello";
    const HALF: &[u8] = b"POST /translate HTTP/1.1\r\nHost: x\r\nCont";

    /// `bytes` read in pieces of `piece` bytes, the requests in them handed over as hyper
    /// would (with these body lengths); whether the wait for the head after them finds some
    /// of it held.
    fn next_head_held(bytes: &[u8], piece: usize, bodies: &[Option<u64>]) -> bool {
        let mut framing = Framing::default();
        assert!(!framing.head_started(), "nothing read yet");
        for chunk in bytes.chunks(piece) {
            framing.read(chunk);
        }
        for (i, &body) in bodies.iter().enumerate() {
            if i > 0 {
                assert!(framing.head_started(), "request {i} was read whole");
            }
            framing.request(body);
        }
        framing.head_started()
    }

    #[test]
    fn a_head_sent_behind_a_request_is_held_and_an_idle_wait_is_not() {
        let cat = |parts: &[&[u8]]| parts.concat();
        for piece in [1, 3, 7, 4096] {
            assert!(!next_head_held(GET, piece, &[Some(0)]), "{piece}");
            assert!(!next_head_held(POST, piece, &[Some(5)]), "{piece}");
            assert!(next_head_held(&cat(&[GET, HALF]), piece, &[Some(0)]));
            assert!(next_head_held(&cat(&[POST, HALF]), piece, &[Some(5)]));
            // Two whole requests, then half of a third; then the same with nothing after.
            let two = cat(&[POST, GET, HALF]);
            assert!(next_head_held(&two, piece, &[Some(5), Some(0)]));
            assert!(!next_head_held(
                &cat(&[POST, GET]),
                piece,
                &[Some(5), Some(0)]
            ));
            // Empty lines between requests are not a head (RFC 9112 2.2), LF alone ends lines.
            assert!(!next_head_held(&cat(&[POST, b"\r\n"]), piece, &[Some(5)]));
            let bare = b"GET / HTTP/1.1\nHost: a\n\nGET";
            assert!(next_head_held(bare, piece, &[Some(0)]));
        }
    }

    #[test]
    fn after_a_body_of_unknown_length_the_next_wait_starts_over() {
        let chunked =
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
        let mut framing = Framing::default();
        framing.read(&[&chunked[..], HALF].concat());
        framing.request(None);
        assert!(!framing.head_started(), "not known: as before");
        // Followed again from the wait on.
        framing.read(GET);
        framing.request(Some(0));
        framing.read(HALF);
        assert!(framing.head_started());
    }
}
