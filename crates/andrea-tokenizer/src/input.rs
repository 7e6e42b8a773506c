//! Reading a corpus: which files, how they are streamed, and where text can be cut.
//!
//! Files are read in blocks of a few MiB, so memory does not grow with the corpus. A
//! block ends at a *safe cut* ([`crate::pretokenize`]): a position where pre-tokenizing
//! the two sides apart gives the same pieces as pre-tokenizing the whole, and that is not
//! inside a special token. So the pieces of a file do not depend on the block size, and
//! the same cuts split a block further into chunks for parallel work. A file is one text:
//! its pieces are those of the whole file, exactly as [`crate::Tokenizer::encode`] would
//! see it.

use crate::error::{Error, Result};
use crate::pretokenize::safe_cut;
use crate::special::SpecialMatcher;
use std::io::Read;
use std::path::{Path, PathBuf};

/// What to do with bytes that are not UTF-8 in a training or encoding input.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InvalidUtf8 {
    /// Stop with [`Error::InvalidUtf8`], naming the file and the byte offset.
    #[default]
    Error,
    /// Take the bytes as they are: each invalid sequence is a piece of its own (byte
    /// tokens, merged where merges apply), the valid text around it is encoded as usual.
    Bytes,
}

/// The files named by `paths`: a file is taken as it is, a directory for every regular
/// file below it (recursively, in sorted order, skipping names that start with `.`).
/// Errors if a path does not exist or nothing is found.
pub fn collect_files<P: AsRef<Path>>(paths: &[P]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        let p = p.as_ref();
        // A FIFO would block the read forever and a device never end: a named input is a
        // regular file or a directory (inside a directory only regular files are read).
        andrea_fs::check_input(p).map_err(|e| Error::io(p, e))?;
        let meta = std::fs::metadata(p).map_err(|e| Error::io(p, e))?;
        if meta.is_dir() {
            walk(p, &mut out)?;
        } else {
            out.push(p.to_path_buf());
        }
    }
    if out.is_empty() {
        return Err(Error::Invalid(format!(
            "no input files found in {}",
            paths
                .iter()
                .map(|p| p.as_ref().display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .map(|e| e.map(|e| e.path()).map_err(|e| Error::io(dir, e)))
        .collect::<Result<_>>()?;
    entries.sort();
    for path in entries {
        if path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with('.'))
        {
            continue;
        }
        let meta = std::fs::metadata(&path).map_err(|e| Error::io(&path, e))?;
        if meta.is_dir() {
            walk(&path, out)?;
        } else if meta.is_file() {
            out.push(path);
        }
    }
    Ok(())
}

/// The first safe cut at or after `from` that is not inside a special token.
pub(crate) fn find_cut(
    text: &str,
    from: usize,
    specials: Option<&SpecialMatcher>,
) -> Option<usize> {
    let mut from = from;
    loop {
        let p = safe_cut(text, from)?;
        match specials {
            Some(m) if m.spans(text, p) => from = p + 1,
            _ => return Some(p),
        }
    }
}

/// A safe cut at or after `from` in bytes that need not be UTF-8: inside a valid stretch.
fn find_cut_bytes(bytes: &[u8], from: usize, specials: Option<&SpecialMatcher>) -> Option<usize> {
    let mut start = 0;
    for chunk in bytes.utf8_chunks() {
        let valid = chunk.valid();
        let end = start + valid.len();
        if end > from {
            let local = from.saturating_sub(start).max(1);
            if let Some(p) = find_cut(valid, local, specials) {
                return Some(start + p);
            }
        }
        start = end + chunk.invalid().len();
    }
    None
}

/// A safe cut at or after `from` in bytes, UTF-8 or not.
pub(crate) fn find_cut_in(
    bytes: &[u8],
    from: usize,
    specials: Option<&SpecialMatcher>,
) -> Option<usize> {
    match std::str::from_utf8(bytes) {
        Ok(t) => find_cut(t, from.max(1), specials),
        Err(_) => find_cut_bytes(bytes, from, specials),
    }
}

/// Cuts `bytes` at safe positions into chunks of about `target` bytes (larger where no
/// cut is found). Returns the chunk ends; the last is `bytes.len()`.
pub(crate) fn chunk_ends(
    bytes: &[u8],
    target: usize,
    specials: Option<&SpecialMatcher>,
) -> Vec<usize> {
    let target = target.max(1);
    let mut ends = Vec::with_capacity(bytes.len() / target + 1);
    let text = std::str::from_utf8(bytes).ok();
    let mut start = 0;
    while bytes.len() - start > target + target / 2 {
        let cut = match text {
            Some(t) => find_cut(t, start + target, specials),
            None => find_cut_bytes(bytes, start + target, specials),
        };
        match cut {
            Some(p) if p > start && p < bytes.len() => {
                ends.push(p);
                start = p;
            }
            _ => break,
        }
    }
    ends.push(bytes.len());
    ends
}

/// A block of a file: bytes that can be processed on their own.
pub(crate) struct Block {
    pub bytes: Vec<u8>,
    /// Is this the first block of its file?
    pub first: bool,
}

/// Streams one file in blocks that end at safe cuts, checking UTF-8 on the way.
pub(crate) struct BlockReader<'m> {
    file: Box<dyn Read + 'm>,
    path: PathBuf,
    policy: InvalidUtf8,
    specials: Option<&'m SpecialMatcher>,
    block_size: usize,
    buf: Vec<u8>,
    /// File offset of `buf[0]`.
    offset: u64,
    /// `buf[..checked]` is known valid UTF-8 (policy `Error` only).
    checked: usize,
    eof: bool,
    first: bool,
}

impl<'m> BlockReader<'m> {
    /// Blocks of the file at `path` (the readers of the crate open files through
    /// [`crate::documents`], which decompresses them).
    #[cfg(test)]
    pub(crate) fn open(
        path: &Path,
        policy: InvalidUtf8,
        specials: Option<&'m SpecialMatcher>,
        block_size: usize,
    ) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        Ok(Self::from_reader(
            Box::new(file),
            path,
            policy,
            specials,
            block_size,
        ))
    }

    /// Blocks of what `file` reads (a decompressor, say); `path` names it in errors.
    pub(crate) fn from_reader(
        file: Box<dyn Read + 'm>,
        path: &Path,
        policy: InvalidUtf8,
        specials: Option<&'m SpecialMatcher>,
        block_size: usize,
    ) -> Self {
        BlockReader {
            file,
            path: path.to_path_buf(),
            policy,
            specials,
            block_size: block_size.max(4096),
            buf: Vec::new(),
            offset: 0,
            checked: 0,
            eof: false,
            first: true,
        }
    }

    /// Reads until `buf` holds `want` bytes or the file ends; returns bytes read.
    fn fill(&mut self, want: usize) -> Result<usize> {
        let before = self.buf.len();
        while self.buf.len() < want && !self.eof {
            let old = self.buf.len();
            self.buf.resize(want, 0);
            match self.file.read(&mut self.buf[old..]) {
                Ok(0) => {
                    self.buf.truncate(old);
                    self.eof = true;
                }
                Ok(n) => self.buf.truncate(old + n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => self.buf.truncate(old),
                Err(e) => {
                    self.buf.truncate(old);
                    return Err(Error::io(&self.path, e));
                }
            }
        }
        Ok(self.buf.len() - before)
    }

    /// Extends `checked` over the new bytes; errors on invalid UTF-8 (policy `Error`).
    fn check(&mut self) -> Result<()> {
        if self.policy == InvalidUtf8::Bytes {
            return Ok(());
        }
        match std::str::from_utf8(&self.buf[self.checked..]) {
            Ok(_) => self.checked = self.buf.len(),
            Err(e) => {
                let bad_at = self.checked + e.valid_up_to();
                if e.error_len().is_none() && !self.eof {
                    // An incomplete character at the end: its rest is still to come.
                    self.checked = bad_at;
                } else {
                    return Err(Error::InvalidUtf8 {
                        path: self.path.clone(),
                        offset: self.offset + bad_at as u64,
                    });
                }
            }
        }
        Ok(())
    }

    /// The next block, or `None` at the end of the file.
    pub(crate) fn next_block(&mut self) -> Result<Option<Block>> {
        let mut want = self.block_size;
        loop {
            self.fill(want)?;
            self.check()?;
            if self.buf.is_empty() {
                return Ok(None);
            }
            let cut = if self.eof {
                Some(self.buf.len())
            } else {
                let half = self.buf.len() / 2;
                match self.policy {
                    InvalidUtf8::Error => {
                        // `buf[..checked]` is valid; an incomplete tail stays for later.
                        let text = std::str::from_utf8(&self.buf[..self.checked]).unwrap_or("");
                        find_cut(text, half.min(self.checked), self.specials)
                            .or_else(|| find_cut(text, 1, self.specials))
                    }
                    InvalidUtf8::Bytes => find_cut_bytes(&self.buf, half, self.specials)
                        .or_else(|| find_cut_bytes(&self.buf, 1, self.specials)),
                }
            };
            match cut {
                Some(p) => {
                    let rest = self.buf.split_off(p);
                    let bytes = std::mem::replace(&mut self.buf, rest);
                    self.offset += p as u64;
                    self.checked = self.checked.saturating_sub(p);
                    let first = std::mem::replace(&mut self.first, false);
                    return Ok(Some(Block { bytes, first }));
                }
                // No cut in the whole buffer: read more and look again.
                None => want = self.buf.len() + self.block_size,
            }
        }
    }
}

/// Total size of the files, for progress bars.
pub(crate) fn total_size(files: &[PathBuf]) -> u64 {
    files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pretokenize::pieces;
    use std::io::Write;

    #[test]
    fn chunking_covers_the_text() {
        let s = "word, ".repeat(1000);
        let ends = chunk_ends(s.as_bytes(), 100, None);
        assert!(ends.len() > 10);
        assert_eq!(*ends.last().unwrap(), s.len());
        assert!(ends.windows(2).all(|w| w[0] < w[1]));
        let unbreakable = "a".repeat(1000);
        assert_eq!(chunk_ends(unbreakable.as_bytes(), 100, None), vec![1000]);
    }

    #[test]
    fn blocks_preserve_pieces_and_specials() {
        let text = "Hello, world! <|endoftext|>It's  a\n\n\ntest: x=1; ".repeat(500);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.txt");
        std::fs::File::create(&path)
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let m = SpecialMatcher::new(&[crate::SpecialToken {
            content: "<|endoftext|>".into(),
            id: 0,
        }]);
        let mut r = BlockReader::open(&path, InvalidUtf8::Error, Some(&m), 4096).unwrap();
        let mut got = Vec::new();
        let mut blocks = 0;
        while let Some(b) = r.next_block().unwrap() {
            let s = String::from_utf8(b.bytes).unwrap();
            for seg in m.segments(&s) {
                if let crate::special::Segment::Text(t) = seg {
                    got.extend(pieces(t).map(str::to_string));
                } else {
                    got.push("<special>".into());
                }
            }
            blocks += 1;
        }
        assert!(blocks > 3);
        let mut want = Vec::new();
        for seg in m.segments(&text) {
            if let crate::special::Segment::Text(t) = seg {
                want.extend(pieces(t).map(str::to_string));
            } else {
                want.push("<special>".into());
            }
        }
        assert_eq!(got, want);
    }

    #[test]
    fn invalid_utf8_names_the_offset() {
        let mut bytes = "abc, def. ".repeat(2000).into_bytes();
        bytes[12_345] = 0xFF;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.txt");
        std::fs::write(&path, &bytes).unwrap();
        let mut r = BlockReader::open(&path, InvalidUtf8::Error, None, 4096).unwrap();
        let err = loop {
            match r.next_block() {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("no error"),
                Err(e) => break e,
            }
        };
        match err {
            Error::InvalidUtf8 { offset, .. } => assert_eq!(offset, 12_345),
            e => panic!("{e}"),
        }
        // The byte path reads it all back.
        let mut r = BlockReader::open(&path, InvalidUtf8::Bytes, None, 4096).unwrap();
        let mut all = Vec::new();
        while let Some(b) = r.next_block().unwrap() {
            all.extend(b.bytes);
        }
        assert_eq!(all, bytes);
    }

    #[test]
    fn collect_files_walks_sorted_and_skips_hidden() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::create_dir(dir.path().join(".git")).unwrap();
        std::fs::write(dir.path().join("b.txt"), "b").unwrap();
        std::fs::write(dir.path().join("a.txt"), "a").unwrap();
        std::fs::write(dir.path().join("sub/c.txt"), "c").unwrap();
        std::fs::write(dir.path().join(".git/x"), "x").unwrap();
        let files = collect_files(&[dir.path()]).unwrap();
        let names: Vec<_> = files
            .iter()
            .map(|f| {
                f.strip_prefix(dir.path())
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        assert_eq!(names, ["a.txt", "b.txt", "sub/c.txt"]);
        assert!(collect_files(&[dir.path().join("missing")]).is_err());
        // A device named as an input is refused before anything reads it.
        let err = collect_files(&[Path::new("/dev/zero")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a regular file"), "{err}");
        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(
            collect_files(&[empty.path()]),
            Err(Error::Invalid(_))
        ));
    }
}
