//! GPT-2's byte-to-unicode table: how `tokenizer.json`, `vocab.json` and `merges.txt`
//! spell a token made of arbitrary bytes as a printable string.
//!
//! The bytes that are printable and not a space (`!`..=`~`, `¡`..=`¬`, `®`..=`ÿ`: 188 of
//! them) stand for themselves; the other 68 (controls, space, DEL, NBSP, soft hyphen, ...)
//! are shifted to U+0100.. in increasing byte order, so the space byte is `Ġ` (U+0120)
//! and the newline is `Ċ` (U+010A).
//!
//! The same order defines andrea's byte token ids: id `i` (0..256) is the single byte
//! [`BYTE_ORDER`]`[i]`, the order GPT-2's own vocabulary uses. Sorted by their unicode
//! stand-in, the bytes come in exactly this order, which is also the order in which the
//! Hugging Face trainer numbers its alphabet; so ties in training break the same way here
//! and there (see [`crate::train`]).

/// `BYTE_ORDER[i]` is the byte of byte token `i`.
pub const BYTE_ORDER: [u8; 256] = build_byte_order();

/// `BYTE_TO_CHAR[b]` is the printable stand-in of byte `b`.
pub const BYTE_TO_CHAR: [char; 256] = build_byte_to_char();

/// Is `b` one of the 188 bytes that stand for themselves?
const fn is_self_standing(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

const fn build_byte_order() -> [u8; 256] {
    let mut order = [0u8; 256];
    let mut n = 0;
    let mut b = 0usize;
    while b < 256 {
        if is_self_standing(b as u8) {
            order[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    b = 0;
    while b < 256 {
        if !is_self_standing(b as u8) {
            order[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    order
}

const fn build_byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut shifted = 0u32;
    let mut b = 0usize;
    while b < 256 {
        table[b] = if is_self_standing(b as u8) {
            match char::from_u32(b as u32) {
                Some(c) => c,
                None => panic!("unreachable: bytes are valid chars"),
            }
        } else {
            let c = match char::from_u32(256 + shifted) {
                Some(c) => c,
                None => panic!("unreachable: U+0100.. are valid chars"),
            };
            shifted += 1;
            c
        };
        b += 1;
    }
    table
}

/// The byte a stand-in character represents, or `None` for a character outside the
/// table.
#[inline]
pub fn char_to_byte(c: char) -> Option<u8> {
    let u = c as u32;
    if u < 256 {
        let b = u as u8;
        is_self_standing(b).then_some(b)
    } else if u < 256 + 68 {
        // The shifted bytes in increasing order: find the (u - 256)-th non-self-standing
        // byte. 68 entries: a tiny table built once at compile time.
        Some(SHIFTED[(u - 256) as usize])
    } else {
        None
    }
}

const SHIFTED: [u8; 68] = {
    let mut t = [0u8; 68];
    let mut n = 0;
    let mut b = 0usize;
    while b < 256 {
        if !is_self_standing(b as u8) {
            t[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    t
};

/// Spell bytes with the stand-in characters (one char per byte).
pub fn bytes_to_string(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| BYTE_TO_CHAR[b as usize]).collect()
}

/// Read a stand-in spelling back to bytes; `Err(c)` names the first character that is not
/// in the table.
pub fn string_to_bytes(s: &str) -> Result<Vec<u8>, char> {
    s.chars().map(|c| char_to_byte(c).ok_or(c)).collect()
}

/// `BYTE_ID[b]` is the id of byte `b` in andrea's native layout (inverse of
/// [`BYTE_ORDER`]).
pub(crate) const BYTE_ID: [u32; 256] = {
    let order = build_byte_order();
    let mut ids = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        ids[order[i] as usize] = i as u32;
        i += 1;
    }
    ids
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_gpt2s() {
        assert_eq!(BYTE_TO_CHAR[b' ' as usize], 'Ġ');
        assert_eq!(BYTE_TO_CHAR[b'\n' as usize], 'Ċ');
        assert_eq!(BYTE_TO_CHAR[0], 'Ā');
        assert_eq!(BYTE_TO_CHAR[b'a' as usize], 'a');
        assert_eq!(BYTE_TO_CHAR[0xAD], 'Ń'); // soft hyphen, the last shifted byte
        assert_eq!(BYTE_ORDER[0], b'!');
        assert_eq!(BYTE_ORDER[188], 0);
        assert_eq!(BYTE_ORDER[255], 0xAD);
    }

    #[test]
    fn table_is_a_bijection() {
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(BYTE_TO_CHAR[b as usize]), Some(b));
            assert_eq!(BYTE_ORDER[BYTE_ID[b as usize] as usize], b);
        }
        assert_eq!(char_to_byte(' '), None);
        assert_eq!(char_to_byte('\u{0144}'), None);
        assert_eq!(char_to_byte('é'), Some(0xE9));
        assert_eq!(string_to_bytes("ĠhiĊ"), Ok(b" hi\n".to_vec()));
        assert_eq!(string_to_bytes("a b"), Err(' '));
    }

    #[test]
    fn unicode_order_is_byte_order() {
        // The order of the stand-ins is the order of the byte ids (what makes ties break
        // like the Hugging Face trainer's).
        for i in 1..256 {
            assert!(
                BYTE_TO_CHAR[BYTE_ORDER[i - 1] as usize] < BYTE_TO_CHAR[BYTE_ORDER[i] as usize]
            );
        }
    }
}
