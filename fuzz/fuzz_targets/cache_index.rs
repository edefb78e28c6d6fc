//! Any bytes through the cache index's decoders (the journal and snapshot
//! records and headers, cache/recover.rs): they must never panic, and every
//! record they accept must encode back to exactly its bytes. The first 8
//! bytes are the generation the records are checked against.
#![no_main]

use libfuzzer_sys::fuzz_target;
use locafs::cache::recover;

fuzz_target!(|data: &[u8]| {
    let Some((gen, body)) = data.split_first_chunk::<8>() else {
        return;
    };
    let gen = u64::from_le_bytes(*gen);
    for chunk in body.chunks(recover::REC) {
        if let Some(op) = recover::decode(chunk, gen) {
            assert_eq!(&recover::encode(&op, gen)[..], chunk);
        }
    }
    for bs in [4096, 1 << 20] {
        for magic in [b"LOCAFSS1", b"LOCAFSJ1"] {
            if let Some((g, n)) = recover::parse_header(body, magic, bs) {
                assert_eq!(&recover::header(magic, bs, g, n)[..], &body[..recover::REC]);
            }
        }
    }
});
