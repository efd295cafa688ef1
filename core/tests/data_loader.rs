use std::sync::Arc;

use lockstep_core::data::{BatchSampler, DataLoader, DataLoaderConfig, Dataset, HostTensor, Sample};
use lockstep_core::{Error, HostVec, Result};

/// Sample i is [i as f32, 2i as f32] with label i % 3; `fail_at` errors, `panic_at` panics.
struct Numbers {
    len: usize,
    fail_at: Option<usize>,
    panic_at: Option<usize>,
}

impl Dataset for Numbers {
    fn len(&self) -> usize {
        self.len
    }
    fn get(&self, i: usize) -> Result<Sample> {
        if Some(i) == self.fail_at {
            return Err(Error::data(format!("sample {i}"), "unreadable record"));
        }
        assert!(Some(i) != self.panic_at, "dataset bug at {i}");
        Ok(vec![
            HostTensor::new(HostVec::F32(vec![i as f32, 2.0 * i as f32]), [2])?,
            HostTensor::new(HostVec::U32(vec![(i % 3) as u32]), [])?,
        ])
    }
}

fn loader(ds: Numbers, workers: usize, bs: usize, drop_last: bool, shuffle: bool) -> DataLoader {
    let config = DataLoaderConfig {
        batch_size: bs,
        drop_last,
        num_workers: workers,
        prefetch_factor: 2,
    };
    DataLoader::simple(Arc::new(ds), shuffle, 7, config).unwrap()
}

fn firsts(l: &DataLoader, epoch: u64) -> Vec<Vec<usize>> {
    l.iter(epoch).map(|b| b.unwrap().indices).collect()
}

#[test]
fn batches_arrive_in_the_same_order_for_any_number_of_workers() {
    let reference = firsts(
        &loader(
            Numbers {
                len: 103,
                fail_at: None,
                panic_at: None,
            },
            0,
            10,
            false,
            true,
        ),
        2,
    );
    assert_eq!(reference.len(), 11);
    assert_eq!(reference.last().unwrap().len(), 3);
    for workers in [1, 2, 4] {
        let got = firsts(
            &loader(
                Numbers {
                    len: 103,
                    fail_at: None,
                    panic_at: None,
                },
                workers,
                10,
                false,
                true,
            ),
            2,
        );
        assert_eq!(got, reference, "{workers} workers");
    }
    // Collation stacked the fields: batch [10, 2] of values and [10] labels matching the indices.
    let l = loader(
        Numbers {
            len: 103,
            fail_at: None,
            panic_at: None,
        },
        2,
        10,
        true,
        false,
    );
    assert_eq!(l.len(), 10);
    let b = l.iter(0).nth(3).unwrap().unwrap();
    assert_eq!(b.fields[0].shape.dims(), &[10, 2]);
    assert_eq!(
        b.fields[0].data,
        HostVec::F32((30..40).flat_map(|i| [i as f32, 2.0 * i as f32]).collect())
    );
    assert_eq!(b.fields[1].data, HostVec::U32((30..40).map(|i| i % 3).collect()));
}

#[test]
fn resuming_mid_epoch_continues_the_same_order() {
    let l = loader(
        Numbers {
            len: 50,
            fail_at: None,
            panic_at: None,
        },
        2,
        8,
        false,
        true,
    );
    let all = firsts(&l, 5);
    let rest: Vec<Vec<usize>> = l.iter_from(5, 3).map(|b| b.unwrap().indices).collect();
    assert_eq!(rest, all[3..].to_vec());
}

#[test]
fn a_failing_sample_is_an_error_naming_it_not_a_hang() {
    for workers in [0, 2] {
        let l = loader(
            Numbers {
                len: 40,
                fail_at: Some(17),
                panic_at: None,
            },
            workers,
            4,
            false,
            false,
        );
        let results: Vec<_> = l.iter(0).collect();
        let err = results
            .iter()
            .find_map(|r| r.as_ref().err())
            .expect("an error")
            .to_string();
        assert!(err.contains("sample 17") && err.contains("unreadable record"), "{err}");
    }
}

#[test]
fn a_panicking_worker_is_reported_as_an_error() {
    let l = loader(
        Numbers {
            len: 40,
            fail_at: None,
            panic_at: Some(9),
        },
        2,
        4,
        false,
        false,
    );
    let err = l.iter(0).find_map(|r| r.err()).expect("an error").to_string();
    assert!(err.contains("worker") && err.contains("exited unexpectedly"), "{err}");
}

#[test]
fn bad_configuration_is_refused() {
    let cfg = DataLoaderConfig {
        batch_size: 0,
        ..Default::default()
    };
    let err = DataLoader::simple(
        Arc::new(Numbers {
            len: 1,
            fail_at: None,
            panic_at: None,
        }),
        false,
        0,
        cfg,
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("batch_size"), "{err}");
    // A typo's worker count or prefetch depth: refused before a thread starts or a channel of
    // that many batches is made.
    let refused = |config: DataLoaderConfig| {
        let numbers = Numbers {
            len: 1,
            fail_at: None,
            panic_at: None,
        };
        DataLoader::simple(Arc::new(numbers), false, 0, config)
            .err()
            .unwrap()
            .to_string()
    };
    let err = refused(DataLoaderConfig {
        batch_size: 1,
        num_workers: 100_000,
        ..Default::default()
    });
    assert!(
        err.contains("DataLoader num_workers: 100000 threads is more than this machine can use"),
        "{err}"
    );
    let err = refused(DataLoaderConfig {
        batch_size: 1,
        num_workers: 1,
        prefetch_factor: usize::MAX,
        ..Default::default()
    });
    assert!(err.contains("prefetch_factor"), "{err}");
}

/// Batches of uneven sizes, given whole (as a heterogeneous run's ranks take theirs).
struct Listed(Vec<Vec<usize>>);

impl BatchSampler for Listed {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn batches(&self, _epoch: u64) -> Vec<Vec<usize>> {
        self.0.clone()
    }
}

#[test]
fn a_batch_sampler_gives_its_batches_whole_from_any_position() {
    let listed = vec![vec![5, 1, 2], vec![0], vec![9, 8, 7, 6], vec![3, 4]];
    for workers in [0, 2] {
        let numbers = Numbers {
            len: 10,
            fail_at: None,
            panic_at: None,
        };
        let config = DataLoaderConfig {
            num_workers: workers,
            ..Default::default()
        };
        let l = DataLoader::with_batch_sampler(Arc::new(numbers), Arc::new(Listed(listed.clone())), config).unwrap();
        assert_eq!(l.len(), 4);
        assert_eq!(firsts(&l, 0), listed);
        let resumed: Vec<Vec<usize>> = l.iter_from(3, 2).map(|b| b.unwrap().indices).collect();
        assert_eq!(resumed, listed[2..]);
    }
}
