//! The documents of an input file, in the formats datasets come in, streamed.
//!
//! The format is the file name's: `.jsonl`/`.ndjson` (JSON Lines: one object per line,
//! the document under [`ReadOptions::text_field`]: what Hugging Face `datasets` writes
//! with `ds.to_json("x.jsonl")`), `.parquet` (a string column of that name, read a page
//! at a time: `ds.to_parquet("x.parquet")`), anything else plain text (the whole file is
//! one document). Each may be compressed, named with `.gz` or `.zst` after its format
//! (`x.jsonl.gz`, `notes.txt.zst`); a compressed Parquet file is unpacked into a
//! temporary file first (Parquet is read from its footer, so it needs a seekable file).
//!
//! Documents come as [`Piece`]s: a text file in blocks of a few MiB cut where
//! tokenization is unaffected (see [`crate::input`]), a JSON line or Parquet value whole.
//! Memory stays bounded by the block size, the longest line and one Parquet page.

use crate::error::{Error, Result};
use crate::input::{BlockReader, InvalidUtf8};
use crate::special::SpecialMatcher;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
#[cfg(feature = "parquet")]
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How to read documents.
#[derive(Clone, Debug)]
pub(crate) struct ReadOptions<'m> {
    /// The field (JSON Lines) or column (Parquet) holding the text.
    pub text_field: &'m str,
    pub invalid_utf8: InvalidUtf8,
    pub specials: Option<&'m SpecialMatcher>,
    pub block_bytes: usize,
}

/// Part of a document.
pub(crate) struct Piece {
    pub bytes: Vec<u8>,
    /// The first piece of its document.
    pub document_start: bool,
    /// A block of a text file, which may be cut at a safe place (a JSON line or a
    /// Parquet value is kept whole).
    pub cuttable: bool,
    /// Bytes of the file on disk this piece accounts for (its length, for an
    /// uncompressed text file; about its share of the compressed file otherwise).
    pub disk: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Text,
    Jsonl,
    Parquet,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Compression {
    None,
    Gzip,
    Zstd,
}

/// The format and compression of `path`, by its name.
fn kind(path: &Path) -> (Format, Compression) {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    let (inner, compression) = if let Some(s) = name.strip_suffix(".gz") {
        (s, Compression::Gzip)
    } else if let Some(s) = name
        .strip_suffix(".zst")
        .or_else(|| name.strip_suffix(".zstd"))
    {
        (s, Compression::Zstd)
    } else {
        (name.as_str(), Compression::None)
    };
    let format = if inner.ends_with(".jsonl") || inner.ends_with(".ndjson") {
        Format::Jsonl
    } else if inner.ends_with(".parquet") {
        Format::Parquet
    } else {
        Format::Text
    };
    (format, compression)
}

/// A reader that counts the bytes read through it.
struct Counted<R> {
    inner: R,
    count: Arc<AtomicU64>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// How many bytes on disk each piece of a file accounts for.
struct DiskShare {
    compressed: bool,
    /// Bytes read from disk so far, and those already given to pieces.
    read: Arc<AtomicU64>,
    given: u64,
}

impl DiskShare {
    /// The share of a piece of `decoded` bytes: exactly that, uncompressed; the bytes
    /// read from disk since the last piece, compressed.
    fn take(&mut self, decoded: usize) -> u64 {
        if !self.compressed {
            return decoded as u64;
        }
        let now = self.read.load(Ordering::Relaxed);
        now - std::mem::replace(&mut self.given, now)
    }
}

/// `path` opened and decompressed, with the share of the disk its pieces account for.
fn open(path: &Path, compression: Compression) -> Result<(Box<dyn Read>, DiskShare)> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let count = Arc::new(AtomicU64::new(0));
    let counted = BufReader::with_capacity(
        1 << 16,
        Counted {
            inner: file,
            count: count.clone(),
        },
    );
    let reader: Box<dyn Read> = match compression {
        Compression::None => Box::new(counted),
        Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(counted)),
        Compression::Zstd => Box::new(ZstdFrames::new(counted).map_err(|e| Error::io(path, e))?),
    };
    let share = DiskShare {
        compressed: compression != Compression::None,
        read: count,
        given: 0,
    };
    Ok((reader, share))
}

/// Every frame of a zstd stream, one after another (`zstd -c a b > x.zst` concatenates
/// frames; ruzstd's decoder reads one). Pure Rust, so the crate builds for any target
/// without a C compiler.
struct ZstdFrames<R: BufRead> {
    frame: Option<ruzstd::decoding::StreamingDecoder<R, ruzstd::decoding::FrameDecoder>>,
}

impl<R: BufRead> ZstdFrames<R> {
    fn new(source: R) -> std::io::Result<Self> {
        Ok(ZstdFrames {
            frame: Some(Self::frame(source)?),
        })
    }

    fn frame(
        source: R,
    ) -> std::io::Result<ruzstd::decoding::StreamingDecoder<R, ruzstd::decoding::FrameDecoder>>
    {
        ruzstd::decoding::StreamingDecoder::new(source).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("not a zstd stream: {e}"),
            )
        })
    }
}

impl<R: BufRead> Read for ZstdFrames<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let Some(frame) = self.frame.as_mut() else {
                return Ok(0);
            };
            let n = frame.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            // This frame is done: another follows unless the input is.
            let mut source = self.frame.take().expect("a frame").into_inner();
            if source.fill_buf()?.is_empty() {
                return Ok(0);
            }
            self.frame = Some(Self::frame(source)?);
        }
    }
}

/// Calls `sink` with every piece of every document of `path`, in order.
pub(crate) fn read_documents(
    path: &Path,
    options: &ReadOptions,
    sink: &mut dyn FnMut(Piece) -> Result<()>,
) -> Result<()> {
    let (format, compression) = kind(path);
    match format {
        Format::Text => read_text(path, compression, options, sink),
        Format::Jsonl => read_jsonl(path, compression, options, sink),
        Format::Parquet => read_parquet(path, compression, options, sink),
    }
}

fn read_text(
    path: &Path,
    compression: Compression,
    options: &ReadOptions,
    sink: &mut dyn FnMut(Piece) -> Result<()>,
) -> Result<()> {
    let (reader, mut share) = open(path, compression)?;
    let mut blocks = BlockReader::from_reader(
        reader,
        path,
        options.invalid_utf8,
        options.specials,
        options.block_bytes,
    );
    while let Some(block) = blocks.next_block()? {
        let disk = share.take(block.bytes.len());
        sink(Piece {
            bytes: block.bytes,
            document_start: block.first,
            cuttable: true,
            disk,
        })?;
    }
    Ok(())
}

/// The error of a document that cannot be read: the file, where, what, and the fix.
fn bad(path: &Path, at: String, message: String) -> Error {
    Error::Invalid(format!("{}: {at}: {message}", path.display()))
}

fn read_jsonl(
    path: &Path,
    compression: Compression,
    options: &ReadOptions,
    sink: &mut dyn FnMut(Piece) -> Result<()>,
) -> Result<()> {
    let (reader, mut share) = open(path, compression)?;
    let mut lines = BufReader::with_capacity(1 << 16, reader);
    let mut line = Vec::new();
    let mut number = 0u64;
    loop {
        line.clear();
        let n = lines
            .read_until(b'\n', &mut line)
            .map_err(|e| Error::io(path, e))?;
        if n == 0 {
            return Ok(());
        }
        number += 1;
        let disk = share.take(n);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let at = || format!("line {number}");
        let value: serde_json::Value = serde_json::from_slice(&line).map_err(|e| {
            bad(
                path,
                at(),
                format!("not JSON ({e}): a .jsonl file holds one JSON object per line"),
            )
        })?;
        let Some(object) = value.as_object() else {
            return Err(bad(path, at(), "not a JSON object".into()));
        };
        let text = match object.get(options.text_field) {
            Some(serde_json::Value::String(s)) => s,
            // A missing value (`null`) is no document.
            Some(serde_json::Value::Null) => continue,
            Some(other) => {
                return Err(bad(
                    path,
                    at(),
                    format!(
                        "the field {:?} is not a string but {other:.40}: name the text field with --text-field",
                        options.text_field
                    ),
                ))
            }
            None => {
                let fields: Vec<&str> = object.keys().map(String::as_str).take(10).collect();
                return Err(bad(
                    path,
                    at(),
                    format!(
                        "no field {:?} (the fields are {}): name the text field with --text-field",
                        options.text_field,
                        fields.join(", ")
                    ),
                ));
            }
        };
        sink(Piece {
            bytes: text.as_bytes().to_vec(),
            document_start: true,
            cuttable: false,
            disk,
        })?;
    }
}

#[cfg(not(feature = "parquet"))]
fn read_parquet(
    path: &Path,
    _: Compression,
    _: &ReadOptions,
    _: &mut dyn FnMut(Piece) -> Result<()>,
) -> Result<()> {
    Err(Error::Invalid(format!(
        "{}: this andrea was built without Parquet support: rebuild with the default features \
         (the `parquet` feature), or export the data as JSON Lines (`ds.to_json(\"x.jsonl\")`)",
        path.display()
    )))
}

/// A file removed when dropped.
#[cfg(feature = "parquet")]
struct TempFile(PathBuf);

#[cfg(feature = "parquet")]
impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(feature = "parquet")]
fn read_parquet(
    path: &Path,
    compression: Compression,
    options: &ReadOptions,
    sink: &mut dyn FnMut(Piece) -> Result<()>,
) -> Result<()> {
    use parquet::column::reader::ColumnReader;
    use parquet::file::reader::{FileReader, SerializedFileReader};

    let disk_size = std::fs::metadata(path)
        .map_err(|e| Error::io(path, e))?
        .len();
    let mut _unpacked = None;
    let file = if compression == Compression::None {
        File::open(path).map_err(|e| Error::io(path, e))?
    } else {
        let tmp = TempFile(std::env::temp_dir().join(format!(
            "andrea-{}-{}.parquet",
            std::process::id(),
            path.file_name().unwrap_or_default().to_string_lossy()
        )));
        let (mut reader, _) = open(path, compression)?;
        let mut out = File::create(&tmp.0).map_err(|e| Error::io(&tmp.0, e))?;
        std::io::copy(&mut reader, &mut out).map_err(|e| Error::io(path, e))?;
        let file = File::open(&tmp.0).map_err(|e| Error::io(&tmp.0, e))?;
        _unpacked = Some(tmp);
        file
    };
    let failed = |e: parquet::errors::ParquetError| {
        let text = e.to_string();
        let hint = if text.to_ascii_lowercase().contains("zstd") {
            "its pages are zstd-compressed, which andrea does not read: export it again \
             with snappy, gzip or lz4 (`ds.to_parquet(path)` and pandas write snappy), or as \
             JSON Lines"
        } else {
            "is it a Parquet file?"
        };
        bad(path, "Parquet".into(), format!("{text}: {hint}"))
    };
    let reader = SerializedFileReader::new(file).map_err(failed)?;
    let meta = reader.metadata();
    let schema = meta.file_metadata().schema_descr();
    let column = schema
        .columns()
        .iter()
        .position(|c| c.path().parts() == [options.text_field]);
    let Some(column) = column else {
        let names: Vec<String> = schema.columns().iter().map(|c| c.path().string()).collect();
        return Err(bad(
            path,
            "columns".into(),
            format!(
                "no column {:?} (the columns are {}): name the text column with --text-field",
                options.text_field,
                names.join(", ")
            ),
        ));
    };
    let total_rows = meta.file_metadata().num_rows().max(1) as u64;
    let mut row = 0u64;
    let (mut values, mut levels) = (Vec::new(), Vec::new());
    for g in 0..reader.num_row_groups() {
        let group = reader.get_row_group(g).map_err(failed)?;
        let ColumnReader::ByteArrayColumnReader(mut column) =
            group.get_column_reader(column).map_err(failed)?
        else {
            return Err(bad(
                path,
                format!("column {:?}", options.text_field),
                "not a string column: name the text column with --text-field".into(),
            ));
        };
        loop {
            values.clear();
            levels.clear();
            let (records, _, _) = column
                .read_records(1024, Some(&mut levels), None, &mut values)
                .map_err(failed)?;
            if records == 0 {
                break;
            }
            // Each row's share of the file on disk.
            let before = disk_size * row / total_rows;
            row += records as u64;
            let mut disk = disk_size * row / total_rows - before;
            for value in &values {
                let bytes = value.data();
                if options.invalid_utf8 == InvalidUtf8::Error {
                    if let Err(e) = std::str::from_utf8(bytes) {
                        return Err(bad(
                            path,
                            format!("column {:?}", options.text_field),
                            format!("a value is not UTF-8 (at its byte {})", e.valid_up_to()),
                        ));
                    }
                }
                sink(Piece {
                    bytes: bytes.to_vec(),
                    document_start: true,
                    cuttable: false,
                    disk: std::mem::take(&mut disk),
                })?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_compression_come_from_the_name() {
        let k = |n: &str| kind(Path::new(n));
        assert_eq!(k("a.txt"), (Format::Text, Compression::None));
        assert_eq!(k("dir/A.JSONL"), (Format::Jsonl, Compression::None));
        assert_eq!(k("a.ndjson.zst"), (Format::Jsonl, Compression::Zstd));
        assert_eq!(k("a.jsonl.gz"), (Format::Jsonl, Compression::Gzip));
        assert_eq!(k("a.parquet"), (Format::Parquet, Compression::None));
        assert_eq!(k("a.parquet.zstd"), (Format::Parquet, Compression::Zstd));
        assert_eq!(k("notes.gz"), (Format::Text, Compression::Gzip));
        assert_eq!(k("README"), (Format::Text, Compression::None));
    }
}
