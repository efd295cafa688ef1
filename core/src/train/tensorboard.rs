//! TensorBoard event files, Lightning's default logger: a listener that writes each step's loss,
//! learning rate and throughput and each epoch's losses and accuracy as scalars, so
//! `tensorboard --logdir DIR` shows the run beside PyTorch's.
//!
//! The format is small enough to write directly: a file of TFRecords (length, masked CRC-32C of
//! the length, bytes, masked CRC-32C of the bytes), each an `Event` protocol buffer of
//! TensorFlow's `event.proto`; the first names the format version.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::events::{Event, EventListener, Record};
use crate::error::Result;

const CASTAGNOLI: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);

/// Writes a run's scalars to `DIR/events.out.tfevents.<seconds>.<host>.<pid>.0`.
///
/// Steps (every `log_every_n_steps`): `train_loss`, `lr`, `samples_per_sec`, `loss_scale`
/// (16-mixed). Epochs, at the step they ended on: `epoch`, `epoch_train_loss`, `val_loss`,
/// `val_acc`. Records are flushed at every epoch and at the run's end.
pub struct TensorBoardWriter {
    out: BufWriter<File>,
    path: PathBuf,
    last_step: u64,
}

impl TensorBoardWriter {
    /// Creates `dir` if needed and a new event file in it.
    pub fn create(dir: impl AsRef<Path>) -> Result<TensorBoardWriter> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir)?;
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_else(|_| "localhost".into());
        let name = format!(
            "events.out.tfevents.{}.{}.{}.0",
            wall_time() as u64,
            host.trim(),
            std::process::id()
        );
        let path = dir.join(name);
        let mut writer = TensorBoardWriter {
            out: BufWriter::new(File::create(&path)?),
            path,
            last_step: 0,
        };
        let mut version = Vec::new();
        put_double(&mut version, 1, wall_time());
        put_bytes(&mut version, 3, b"brain.Event:2");
        writer.record(&version)?;
        writer.out.flush()?;
        Ok(writer)
    }

    /// The event file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `scalars` as one event at `step`.
    pub fn scalars(&mut self, step: u64, scalars: &[(&str, f64)]) -> Result<()> {
        let mut summary = Vec::new();
        for (tag, value) in scalars {
            let mut entry = Vec::new();
            put_bytes(&mut entry, 1, tag.as_bytes());
            // Summary.Value.simple_value: field 2, a 32-bit float.
            put_key(&mut entry, 2, 5);
            entry.extend_from_slice(&(*value as f32).to_le_bytes());
            put_bytes(&mut summary, 1, &entry);
        }
        let mut event = Vec::new();
        put_double(&mut event, 1, wall_time());
        put_key(&mut event, 2, 0);
        put_varint(&mut event, step);
        put_bytes(&mut event, 5, &summary);
        self.record(&event)
    }

    fn record(&mut self, data: &[u8]) -> Result<()> {
        let len = (data.len() as u64).to_le_bytes();
        self.out.write_all(&len)?;
        self.out.write_all(&masked_crc(&len).to_le_bytes())?;
        self.out.write_all(data)?;
        self.out.write_all(&masked_crc(data).to_le_bytes())?;
        Ok(())
    }
}

impl EventListener for TensorBoardWriter {
    fn on_event(&mut self, record: &Record) -> Result<()> {
        match &record.event {
            Event::Step {
                step,
                loss,
                lr,
                samples_per_sec,
                loss_scale,
                ..
            } => {
                self.last_step = *step;
                let mut values = vec![
                    ("train_loss", *loss),
                    ("lr", *lr),
                    ("samples_per_sec", *samples_per_sec),
                ];
                values.extend(loss_scale.map(|s| ("loss_scale", s)));
                self.scalars(*step, &values)?;
            }
            Event::Epoch {
                epoch,
                train_loss,
                val_loss,
                val_accuracy,
                ..
            } => {
                let mut values = vec![("epoch", *epoch as f64), ("epoch_train_loss", *train_loss)];
                values.extend(val_loss.map(|l| ("val_loss", l)));
                values.extend(val_accuracy.map(|a| ("val_acc", a)));
                self.scalars(self.last_step, &values)?;
                self.out.flush()?;
            }
            Event::RunEnd { .. } => self.out.flush()?,
            _ => {}
        }
        Ok(())
    }
}

fn wall_time() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// TFRecord's checksum: CRC-32C, rotated right by 15 bits plus a constant.
fn masked_crc(bytes: &[u8]) -> u32 {
    CASTAGNOLI.checksum(bytes).rotate_right(15).wrapping_add(0xa282_ead8)
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A protobuf field key: the field number and its wire type (0 varint, 1 64-bit, 2 bytes, 5 32-bit).
fn put_key(out: &mut Vec<u8>, field: u32, wire_type: u8) {
    put_varint(out, u64::from(field) << 3 | u64::from(wire_type));
}

fn put_double(out: &mut Vec<u8>, field: u32, value: f64) {
    put_key(out, field, 1);
    out.extend_from_slice(&value.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_key(out, field, 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_and_varints_follow_the_published_values() {
        // CRC-32C's check value (RFC 3720's test vector) and protobuf's documented varint of 300.
        assert_eq!(CASTAGNOLI.checksum(b"123456789"), 0xe306_9283);
        let mut out = Vec::new();
        put_varint(&mut out, 300);
        assert_eq!(out, [0xac, 0x02]);
    }
}
