//! Names as the kernel gives them (`comm`, at most 16 bytes, any bytes but NUL), made safe to
//! show: a thread can name itself a terminal escape sequence (prctl PR_SET_NAME).

pub fn comm_string(raw: &[u8]) -> String {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

/// Characters that would change how a terminal shows what follows (C0/C1 controls, DEL, and
/// the bidirectional overrides that reorder a line), when they are not meant.
pub fn unsafe_for_terminals(c: char, keep_newlines: bool) -> bool {
    (c.is_control() && !(keep_newlines && c == '\n'))
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn escape_into(out: &mut String, c: char) {
    use std::fmt::Write as _;
    let _ = match c {
        '\n' => write!(out, "\\n"),
        '\t' => write!(out, "\\t"),
        c if (c as u32) < 0x100 => write!(out, "\\x{:02x}", c as u32),
        c => write!(out, "\\u{{{:x}}}", c as u32),
    };
}

/// A name from the kernel or /proc (a thread's comm, a command line) as it may be shown in a
/// sentence or a table: control characters and bidirectional overrides escaped (`\x1b`, `\n`),
/// and backslashes doubled so an escape cannot be faked. A thread can name itself anything
/// but NUL (prctl PR_SET_NAME), including terminal escape sequences.
pub fn printable(name: &str) -> std::borrow::Cow<'_, str> {
    if !name
        .chars()
        .any(|c| c == '\\' || unsafe_for_terminals(c, false))
    {
        return std::borrow::Cow::Borrowed(name);
    }
    let mut out = String::with_capacity(name.len() + 8);
    for c in name.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            c if unsafe_for_terminals(c, false) => escape_into(&mut out, c),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Text for a terminal: every control character but the newlines escaped. The last line of
/// defence for whole outputs; names are escaped where they are formatted (`printable`), which
/// also catches a newline inside a name.
pub fn terminal_safe(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(|c| unsafe_for_terminals(c, true)) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if unsafe_for_terminals(c, true) {
            escape_into(&mut out, c);
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_cannot_drive_the_terminal() {
        assert_eq!(printable("python3"), "python3");
        let evil = "x\u{1b}]0;owned\u{7}\u{1b}[2J\nfake line\u{202e}";
        let p = printable(evil);
        assert_eq!(p, "x\\x1b]0;owned\\x07\\x1b[2J\\nfake line\\u{202e}");
        assert!(!p.chars().any(char::is_control));
        assert_eq!(
            printable("a\\x1b"),
            "a\\\\x1b",
            "a literal backslash cannot fake one"
        );
        assert_eq!(terminal_safe("ok\nline\u{9b}2J"), "ok\nline\\x9b2J");
    }

    #[test]
    fn comm_is_cut_at_nul_and_lossy() {
        assert_eq!(comm_string(b"abc\0def"), "abc");
        assert_eq!(comm_string(b"\xffx"), "\u{fffd}x");
        assert_eq!(comm_string(b"sixteen_chars_ab"), "sixteen_chars_ab");
    }
}
