//! Any bytes through the peer frame decoder: it must never panic, never
//! consume bytes when it asks for more or fails, never take more than
//! `MAX_FRAME` bytes for one frame, and every frame it returns must encode
//! back to exactly the bytes it consumed; `decode_whole` likewise.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use locafs::peer::codec;

fuzz_target!(|data: &[u8]| {
    let mut buf = BytesMut::from(data);
    loop {
        let before = buf.clone();
        match codec::decode(&mut buf) {
            Ok(Some(frame)) => {
                let consumed = before.len() - buf.len();
                assert_eq!(consumed, frame.encoded_len());
                assert!(consumed <= codec::MAX_FRAME);
                let mut again = BytesMut::new();
                codec::encode(&frame, &mut again).expect("a decoded frame encodes");
                assert_eq!(&again[..], &before[..consumed]);
            }
            Ok(None) | Err(_) => {
                assert_eq!(buf, before, "nothing consumed");
                break;
            }
        }
    }
    let _ = codec::frame_len(data);
    let _ = codec::decode_eof(&mut BytesMut::from(data));
    // The whole-reply decoder: a frame it returns is exactly the input.
    if let Ok(frame) = codec::decode_whole(bytes::Bytes::copy_from_slice(data), codec::MAX_BLOCK_LEN) {
        let mut again = BytesMut::new();
        codec::encode(&frame, &mut again).expect("a decoded frame encodes");
        assert_eq!(&again[..], data);
    }
});
