//! Reading records from JSONL and Parquet files.
//!
//! JSONL is split on `\n` only (never on U+2028 / U+2029 / `\r`-only, which `str::lines` in other
//! languages treats as breaks: GSM8K train row 2381 holds U+2028); blank lines are skipped; a trailing
//! `\r` is allowed. Parquet is read through the `parquet` crate's record API (Snappy or uncompressed
//! pages), each row becoming a JSON object (struct columns become nested objects, list columns
//! arrays; binary columns without the UTF8 annotation, as Spark and Hive write text, are read as
//! UTF-8 text, and a value that is not UTF-8 is an error naming the row and column). [`FieldReader`] reads a row's fields by name or dotted path, and a question field as
//! text or chat messages. Every error names the file and the 1-based line or row.

use crate::template::ChatMessage;
use crate::{DataError, Result};
use serde_json::{Map, Value};
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

/// The longest JSONL line read, in bytes without its newline (64 MiB): a longer one is [`DataError::LineTooLong`]
/// instead of an unbounded allocation.
pub const MAX_LINE_BYTES: usize = 64 << 20;

/// The most rows read from one Parquet file (10 million; the largest public RL prompt sets hold
/// a few million). A Parquet file's size does not bound its rows: a 147 KB dictionary-encoded file
/// of 30 million rows made the loader abort at 5.6 GB (issue 49 item 11). More is
/// [`DataError::Unreadable`], checked from the footer before any row is decoded.
pub const MAX_PARQUET_ROWS: u64 = 10_000_000;

/// One record: its 1-based line (JSONL) or row (Parquet) and its fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// 1-based line or row number, for error messages.
    pub line: usize,
    /// The record's fields.
    pub fields: Map<String, Value>,
}

/// Reads every record of `path`: Parquet when the name ends in `.parquet`, JSONL otherwise.
///
/// # Errors
/// [`DataError::Io`] when the file cannot be read, [`DataError::Malformed`] for a line that is not a
/// JSON object (naming file and line) or an unreadable Parquet row.
pub fn read_records(path: &Path) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    for_each_record(path, |r| {
        out.push(r);
        Ok(())
    })?;
    Ok(out)
}

/// Hands every record of `path` to `f` in file order, one at a time (Parquet when the name ends
/// in `.parquet`, JSONL otherwise): only the record being handled is held, so a caller that
/// keeps less than the whole record (the fields it reads) needs no memory for the others. Stops
/// at `f`'s first error.
///
/// # Errors
/// As [`read_records`], and `f`'s.
pub fn for_each_record(path: &Path, f: impl FnMut(Record) -> Result<()>) -> Result<()> {
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
    {
        for_each_parquet(path, f)
    } else {
        for_each_jsonl(path, f)
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> DataError + '_ {
    move |source| DataError::Io {
        file: path.to_path_buf(),
        source,
    }
}

/// Reads a JSONL file of JSON objects (see the module docs for line splitting). A UTF-8
/// byte-order mark before the first line is skipped.
///
/// # Errors
/// As [`read_records`].
pub fn read_jsonl(path: &Path) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    for_each_jsonl(path, |r| {
        out.push(r);
        Ok(())
    })?;
    Ok(out)
}

/// [`for_each_record`] of a JSONL file.
fn for_each_jsonl(path: &Path, mut f: impl FnMut(Record) -> Result<()>) -> Result<()> {
    let file = std::fs::File::open(path).map_err(io_err(path))?;
    let mut reader = BufReader::new(file);
    let mut buf = Vec::new();
    let mut line = 0;
    loop {
        buf.clear();
        // At most the limit, a newline and one more byte are read: the check below sees an
        // over-long line without holding all of it.
        let limit = (MAX_LINE_BYTES + 2) as u64;
        if (&mut reader)
            .take(limit)
            .read_until(b'\n', &mut buf)
            .map_err(io_err(path))?
            == 0
        {
            break;
        }
        line += 1;
        if buf.len() - usize::from(buf.ends_with(b"\n")) > MAX_LINE_BYTES {
            return Err(DataError::LineTooLong {
                file: path.to_path_buf(),
                line,
                limit: MAX_LINE_BYTES,
            });
        }
        let malformed = |reason: String| DataError::Malformed {
            file: path.to_path_buf(),
            line,
            reason,
        };
        let text = std::str::from_utf8(&buf).map_err(|e| malformed(format!("not UTF-8: {e}")))?;
        let text = text.strip_suffix('\n').unwrap_or(text);
        let text = text.strip_suffix('\r').unwrap_or(text);
        // A UTF-8 byte-order mark at the start of the file (Windows editors, Excel exports) is
        // skipped, as Python's `utf-8-sig` and pandas' JSONL reader do; anywhere else it is data.
        let text = if line == 1 {
            text.strip_prefix('\u{feff}').unwrap_or(text)
        } else {
            text
        };
        if text.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(fields)) => f(Record { line, fields })?,
            Ok(other) => {
                return Err(malformed(format!(
                    "expected a JSON object, found {}",
                    kind(&other)
                )))
            }
            Err(e) => return Err(malformed(format!("invalid JSON: {e}"))),
        }
    }
    Ok(())
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Parquet is not compiled in: always an error saying how to enable it.
///
/// # Errors
/// Always [`DataError::Malformed`] naming the file.
#[cfg(not(feature = "parquet"))]
pub fn read_parquet(path: &Path) -> Result<Vec<Record>> {
    for_each_parquet(path, |_| Ok(())).map(|()| Vec::new())
}

/// Parquet is not compiled in: always an error saying how to enable it.
#[cfg(not(feature = "parquet"))]
fn for_each_parquet(path: &Path, _f: impl FnMut(Record) -> Result<()>) -> Result<()> {
    Err(DataError::Malformed {
        file: path.to_path_buf(),
        line: 0,
        reason: "this build has no Parquet support; rebuild rlvr-data with its `parquet` feature"
            .into(),
    })
}

/// Reads a Parquet file, one record per row (columns by name; nested lists become arrays).
///
/// # Errors
/// As [`read_records`]; a column compressed with a codec other than Snappy or none (zstd, polars'
/// default; gzip; lz4; brotli) is [`DataError::Unreadable`] naming the column, the codec and how to
/// rewrite the file.
#[cfg(feature = "parquet")]
pub fn read_parquet(path: &Path) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    for_each_parquet(path, |r| {
        out.push(r);
        Ok(())
    })?;
    Ok(out)
}

/// [`for_each_record`] of a Parquet file.
#[cfg(feature = "parquet")]
fn for_each_parquet(path: &Path, mut f: impl FnMut(Record) -> Result<()>) -> Result<()> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let file = std::fs::File::open(path).map_err(io_err(path))?;
    let bad = |line: usize, e: parquet::errors::ParquetError| DataError::Malformed {
        file: path.to_path_buf(),
        line,
        reason: format!("Parquet: {e}"),
    };
    let reader = SerializedFileReader::new(file).map_err(|e| bad(0, e))?;
    let meta = reader.metadata();
    for column in meta.row_groups().iter().flat_map(|g| g.columns()) {
        use parquet::basic::Compression;
        let codec = column.compression();
        if !matches!(codec, Compression::UNCOMPRESSED | Compression::SNAPPY) {
            let name = format!("{codec:?}");
            let name = name.split('(').next().unwrap_or(&name);
            return Err(DataError::Unreadable {
                file: path.to_path_buf(),
                reason: format!(
                    "column `{}` is compressed with {name}, which rlvr does not read (it reads \
                     Snappy-compressed and uncompressed Parquet): rewrite the file with Snappy \
                     (pyarrow: pq.write_table(table, path, compression=\"snappy\"); polars: \
                     df.write_parquet(path, compression=\"snappy\"))",
                    column.column_path().string()
                ),
            });
        }
    }
    // The footer states the rows twice (file and row groups): the larger bounds what is decoded.
    let in_groups: u64 = meta
        .row_groups()
        .iter()
        .map(|g| u64::try_from(g.num_rows()).unwrap_or(u64::MAX))
        .fold(0, u64::saturating_add);
    let stated = u64::try_from(meta.file_metadata().num_rows()).unwrap_or(u64::MAX);
    let rows = stated.max(in_groups);
    if rows > MAX_PARQUET_ROWS {
        return Err(DataError::Unreadable {
            file: path.to_path_buf(),
            reason: format!(
                "{rows} rows, more than rlvr reads from one Parquet file ({MAX_PARQUET_ROWS}); \
                 split it into files of at most that many rows, or sample it (pyarrow: \
                 pq.write_table(table.slice(0, N), path, compression=\"snappy\"))"
            ),
        });
    }
    let rows = reader.get_row_iter(None).map_err(|e| bad(0, e))?;
    for (k, row) in rows.enumerate() {
        let row = row.map_err(|e| bad(k + 1, e))?;
        let mut budget = MAX_LINE_BYTES;
        let fields =
            parquet_row_json(&row, "", &mut budget).map_err(|reason| DataError::Malformed {
                file: path.to_path_buf(),
                line: k + 1,
                reason,
            })?;
        f(Record {
            line: k + 1,
            fields,
        })?;
    }
    Ok(())
}

/// A Parquet row as a JSON object, its columns under `prefix` (dotted, for error messages).
///
/// As the `parquet` crate's `to_json_value`, except for binary columns without the `UTF8` /
/// `STRING` annotation (Spark and Hive write text so): the crate turns them into base64, which
/// would train on base64 text; here valid UTF-8 becomes the text it holds.
///
/// A row is bounded as a JSONL line is: its text and binary values and its values' count (8
/// bytes each) draw on `budget` bytes ([`MAX_LINE_BYTES`] a row), so one 200 MB cell or a list of
/// millions of elements is an error naming the column instead of an abort.
///
/// # Errors
/// A binary value that is not valid UTF-8, naming the column and the first invalid byte; a row
/// over the budget, naming the column where it ran out.
#[cfg(feature = "parquet")]
fn parquet_row_json(
    row: &parquet::record::Row,
    prefix: &str,
    budget: &mut usize,
) -> std::result::Result<Map<String, Value>, String> {
    row.get_column_iter()
        .map(|(name, field)| {
            let at = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}.{name}")
            };
            Ok((name.clone(), parquet_field_json(field, &at, budget)?))
        })
        .collect()
}

/// Takes `bytes` from a row's `budget` ([`parquet_row_json`]).
///
/// # Errors
/// Not enough left: the message names column `at`.
#[cfg(feature = "parquet")]
fn spend(budget: &mut usize, bytes: usize, at: &str) -> std::result::Result<(), String> {
    match budget.checked_sub(bytes.saturating_add(8)) {
        Some(left) => {
            *budget = left;
            Ok(())
        }
        None => Err(format!(
            "the row is larger than {MAX_LINE_BYTES} bytes (the limit of a JSONL line) at column \
             `{at}` (a value of {bytes} bytes): rlvr reads prompts and answers, not blobs; drop \
             or shorten the column"
        )),
    }
}

/// One Parquet value as JSON (see [`parquet_row_json`]); `at` names its column.
#[cfg(feature = "parquet")]
fn parquet_field_json(
    field: &parquet::record::Field,
    at: &str,
    budget: &mut usize,
) -> std::result::Result<Value, String> {
    use parquet::record::Field;
    let size = match field {
        Field::Str(s) => s.len(),
        Field::Bytes(b) => b.data().len(),
        _ => 0,
    };
    spend(budget, size, at)?;
    Ok(match field {
        Field::Bytes(b) => match std::str::from_utf8(b.data()) {
            Ok(s) => Value::String(s.to_owned()),
            Err(e) => {
                return Err(format!(
                    "column `{at}` is binary without the UTF8/STRING annotation and this value is \
                     not valid UTF-8 (byte {} of {}): rlvr reads such columns as text and does \
                     not guess an encoding; re-encode the column as UTF-8 strings",
                    e.valid_up_to(),
                    b.data().len()
                ))
            }
        },
        Field::Group(row) => Value::Object(parquet_row_json(row, at, budget)?),
        Field::ListInternal(list) => Value::Array(
            list.elements()
                .iter()
                .enumerate()
                .map(|(i, f)| parquet_field_json(f, &format!("{at}[{i}]"), budget))
                .collect::<std::result::Result<_, _>>()?,
        ),
        Field::MapInternal(map) => Value::Object(
            map.entries()
                .iter()
                .map(|(key, value)| {
                    let key = match parquet_field_json(key, &format!("{at}.key"), budget)? {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    let value = parquet_field_json(value, &format!("{at}[{key}]"), budget)?;
                    Ok((key, value))
                })
                .collect::<std::result::Result<_, String>>()?,
        ),
        other => other.to_json_value(),
    })
}

/// Field access with errors that name the file, line and field.
///
/// A field name is looked up as a top-level key first; when the record has no such key and the
/// name holds dots, it is read as a path into nested objects: `reward_model.ground_truth` is the
/// `ground_truth` key of the `reward_model` object (a JSONL object, or a Parquet struct column),
/// the layout of verl's `examples/data_preprocess/gsm8k.py`. A key that itself holds a dot
/// (`"a.b": …` at top level) is therefore found as it is, before any path.
pub struct FieldReader<'a> {
    /// The file the record came from.
    pub file: &'a Path,
    /// The record.
    pub record: &'a Record,
}

/// A question field's value: text that rlvr renders with the template, or the chat messages of
/// the prompt itself (TRL GRPOTrainer's conversational `prompt` column, verl's `prompt` column:
/// a list of `{"role", "content"}` objects).
#[derive(Debug, Clone, PartialEq)]
pub enum QuestionValue {
    /// A string (or a number, written as JSON writes it).
    Text(String),
    /// A non-empty list of messages, roles `system`, `user` or `assistant`, the last from `user`.
    Messages(Vec<ChatMessage>),
}

/// Looks up `field` in `fields`: the top-level key `field` if present (even when it holds a
/// dot), else the dotted path through nested objects.
///
/// # Errors
/// Why the value is absent, for [`DataError::MissingPath`]: which part of the path is missing or
/// not an object (the keys present there are listed).
fn lookup<'v>(
    fields: &'v Map<String, Value>,
    field: &str,
) -> std::result::Result<&'v Value, String> {
    if let Some(v) = fields.get(field) {
        return Ok(v);
    }
    let parts: Vec<&str> = field.split('.').collect();
    if parts.len() < 2 {
        return Err(String::new());
    }
    let mut here = fields;
    for (i, part) in parts.iter().enumerate() {
        let at = parts[..i].join(".");
        let v = match here.get(*part) {
            Some(v) => v,
            None if i == 0 => return Err(format!("the record has no `{part}`")),
            None => {
                let keys: Vec<&str> = here.keys().map(String::as_str).collect();
                return Err(format!("`{at}` has no `{part}` (its keys: {keys:?})"));
            }
        };
        if i + 1 == parts.len() {
            return Ok(v);
        }
        match v {
            Value::Object(m) => here = m,
            other => {
                let through = parts[..=i].join(".");
                return Err(format!(
                    "`{through}` is {}, not an object holding `{}`",
                    kind(other),
                    parts[i + 1]
                ));
            }
        }
    }
    unreachable!("a path of two or more parts returns in the loop")
}

impl FieldReader<'_> {
    fn get(&self, field: &str, key: &'static str) -> Result<&Value> {
        let missing = |reason: String| {
            if reason.is_empty() {
                // Absent: list the row's fields; present but null: the field is there.
                let fields = if self.record.fields.contains_key(field) {
                    Vec::new()
                } else {
                    self.record.fields.keys().cloned().collect()
                };
                DataError::MissingField {
                    file: self.file.to_path_buf(),
                    line: self.record.line,
                    field: field.to_string(),
                    key,
                    fields,
                }
            } else {
                DataError::MissingPath {
                    file: self.file.to_path_buf(),
                    line: self.record.line,
                    path: field.to_string(),
                    reason,
                    key,
                }
            }
        };
        match lookup(&self.record.fields, field) {
            Ok(Value::Null) if field.contains('.') && !self.record.fields.contains_key(field) => {
                Err(missing(format!("`{field}` is null")))
            }
            Ok(Value::Null) => Err(missing(String::new())),
            Ok(v) => Ok(v),
            Err(reason) => Err(missing(reason)),
        }
    }

    fn bad(&self, field: &str, reason: String) -> DataError {
        DataError::BadField {
            file: self.file.to_path_buf(),
            line: self.record.line,
            field: field.to_string(),
            reason,
        }
    }

    /// The question field: text (as [`FieldReader::text`]) or, when it holds a list, the prompt's
    /// chat messages, each a `{"role", "content"}` object (other keys, such as Parquet's null
    /// struct members, are ignored).
    ///
    /// # Errors
    /// As [`FieldReader::text`]; for a list, [`DataError::BadField`] naming the message at fault
    /// (`FIELD[i].role`, `FIELD[i].content`) for an empty list, an item that is not an object, a
    /// role other than `system`/`user`/`assistant`, a missing or non-string content, or a last
    /// message not from the user (the model answers the user's last message).
    pub fn question(&self, field: &str, key: &'static str) -> Result<QuestionValue> {
        let items = match self.get(field, key)? {
            Value::Array(items) => items,
            Value::Object(_) => {
                return Err(self.bad(
                    field,
                    "must be a string or a list of chat messages, found an object (write one \
                     message as a list: [{\"role\": \"user\", \"content\": \"...\"}])"
                        .into(),
                ))
            }
            _ => return self.text(field, key).map(QuestionValue::Text),
        };
        if items.is_empty() {
            return Err(self.bad(
                field,
                "is an empty list: a list of chat messages needs at least the user's message"
                    .into(),
            ));
        }
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let Value::Object(m) = item else {
                return Err(self.bad(
                    &format!("{field}[{i}]"),
                    format!(
                        "is {}: a list in the question field is read as chat messages, each an \
                         object {{\"role\": \"user\", \"content\": \"...\"}}",
                        kind(item)
                    ),
                ));
            };
            let role = match m.get("role") {
                Some(Value::String(r)) if matches!(r.as_str(), "system" | "user" | "assistant") => {
                    r.clone()
                }
                Some(Value::Null) | None => {
                    return Err(self.bad(
                        &format!("{field}[{i}].role"),
                        "is missing (a chat message needs a role: system, user or assistant)"
                            .into(),
                    ))
                }
                Some(other) => {
                    return Err(self.bad(
                        &format!("{field}[{i}].role"),
                        format!(
                            "is {other}: rlvr reads the roles system, user and assistant (a \
                             tool or other role's turn cannot be rendered as a prompt here)"
                        ),
                    ))
                }
            };
            let content = match m.get("content") {
                Some(Value::String(c)) => c.clone(),
                Some(Value::Null) | None => {
                    return Err(self.bad(
                        &format!("{field}[{i}].content"),
                        "is missing (a chat message needs its text as a string)".into(),
                    ))
                }
                Some(other) => {
                    return Err(self.bad(
                        &format!("{field}[{i}].content"),
                        format!(
                            "must be a string, found {} (multimodal content parts are not read)",
                            kind(other)
                        ),
                    ))
                }
            };
            out.push(ChatMessage { role, content });
        }
        let last = out.len() - 1;
        if out[last].role != "user" {
            return Err(self.bad(
                &format!("{field}[{last}].role"),
                format!(
                    "is {:?}: the last message must be the user's (the prompt asks the model to \
                     answer it)",
                    out[last].role
                ),
            ));
        }
        if out[last].content.trim().is_empty() {
            return Err(self.bad(
                &format!("{field}[{last}].content"),
                "is empty (a prompt needs a question)".into(),
            ));
        }
        Ok(QuestionValue::Messages(out))
    }

    /// A text field; numbers are accepted and written as JSON writes them (`72`, `0.5`).
    ///
    /// # Errors
    /// [`DataError::MissingField`] (mentioning config key `data.<key>`) or [`DataError::BadField`].
    pub fn text(&self, field: &str, key: &'static str) -> Result<String> {
        match self.get(field, key)? {
            Value::String(s) => Ok(s.clone()),
            Value::Number(n) => Ok(n.to_string()),
            other => Err(self.bad(field, format!("must be a string, found {}", kind(other)))),
        }
    }

    /// An integer field (also an integer written as a string).
    ///
    /// # Errors
    /// As [`FieldReader::text`].
    pub fn int(&self, field: &str, key: &'static str) -> Result<i64> {
        let v = self.get(field, key)?;
        let parsed = match v {
            Value::Number(n) => n.as_i64(),
            Value::String(s) => s.trim().parse().ok(),
            _ => None,
        };
        parsed.ok_or_else(|| self.bad(field, format!("must be an integer, found {v}")))
    }

    /// A list of integers (also a string `"1, 2, 3"`).
    ///
    /// # Errors
    /// As [`FieldReader::text`].
    pub fn ints(&self, field: &str, key: &'static str) -> Result<Vec<i64>> {
        let v = self.get(field, key)?;
        let parsed: Option<Vec<i64>> = match v {
            Value::Array(items) => items.iter().map(Value::as_i64).collect(),
            Value::String(s) => s
                .trim_matches(|c| c == '[' || c == ']')
                .split(',')
                .map(|x| x.trim().parse().ok())
                .collect(),
            _ => None,
        };
        parsed.ok_or_else(|| self.bad(field, format!("must be a list of integers, found {v}")))
    }
}
