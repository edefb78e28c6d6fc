//! Any bytes as a request to a node, through what the server does before it
//! touches the source: decode exactly one frame, then `check_request`. To
//! reach past the data set and block size checks, the node is given the
//! data set and block size the request names (when it is a `GetBlock`), and
//! when the input's last byte is odd the version key is replaced by the
//! right hash of the path and version sent (a fuzzer cannot find a blake3
//! preimage), so the checks behind the key are reached too.
//! Must never panic; whatever is accepted names a block inside a file
//! version whose key is the hash of the path and version sent.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use locafs::cache::VersionKey;
use locafs::peer::codec::{self, Frame};
use locafs::peer::server::check_request;
use locafs::source::SourceVersion;
use std::os::unix::ffi::OsStrExt;

fuzz_target!(|data: &[u8]| {
    let mut buf = BytesMut::from(data);
    let Ok(Some(mut frame)) = codec::decode_eof(&mut buf) else {
        return;
    };
    if !buf.is_empty() {
        return;
    }
    if data.last().is_some_and(|b| b & 1 == 1) {
        if let Frame::GetBlock {
            version,
            file,
            path,
            ..
        } = &mut frame
        {
            let v = SourceVersion {
                size: file.size,
                mtime_ns: file.mtime_ns,
                ino: file.ino,
            };
            let rel = std::path::Path::new(std::ffi::OsStr::from_bytes(path));
            *version = VersionKey::new(rel, &v).0;
        }
    }
    let (dataset, block_size) = match &frame {
        Frame::GetBlock {
            dataset,
            block_size,
            ..
        } => (*dataset, u64::from(*block_size)),
        _ => ([0; 16], 1 << 20),
    };
    if let Ok((fv, block)) = check_request(&dataset, block_size, frame) {
        assert!(block < fv.block_count(block_size));
        assert_eq!(VersionKey::new(&fv.rel, &fv.version).0, fv.key.0);
        assert!(codec::check_path(fv.rel.as_os_str().as_encoded_bytes()).is_ok());
    }
});
