//! Writing RESP commands: the framing kvtier writes around the arguments
//! (and the payloads it splices in from the caller's slices).

use std::io::Write;

/// `*<argc>\r\n`: a command's opening.
pub(in crate::backend::redis) fn frame_command(out: &mut Vec<u8>, argc: usize) {
    write!(out, "*{argc}\r\n").expect("into memory");
}

/// `$<len>\r\n`: a bulk argument's opening (its bytes and a CRLF follow).
pub(in crate::backend::redis) fn frame_bulk_len(out: &mut Vec<u8>, len: usize) {
    write!(out, "${len}\r\n").expect("into memory");
}

/// A whole bulk argument.
pub(in crate::backend::redis) fn frame_bulk(out: &mut Vec<u8>, arg: &[u8]) {
    frame_bulk_len(out, arg.len());
    out.extend_from_slice(arg);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_framed_as_resp2_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        frame_command(&mut out, 2);
        frame_bulk(&mut out, b"GET");
        frame_bulk_len(&mut out, 3);
        out.extend_from_slice(b"k\r\n\r\n");
        assert_eq!(out, b"*2\r\n$3\r\nGET\r\n$3\r\nk\r\n\r\n");
    }
}
