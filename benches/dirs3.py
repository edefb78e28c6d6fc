#!/usr/bin/env python3
"""A small S3-compatible server over a directory, for `cargo bench --bench
objstore` at the issue's full size (LOCAFS_OBJ_SERVER=dir).

moto_server reads the whole object to answer each ranged GET (205 ms per
1 MiB range of a 256 MiB object here), so with moto the store, not the
clients, is what a bench of large shards measures. This server answers a
range by reading that range of a file, as a store's disks do.

It serves what object_store's S3 client and rclone's S3 backend send to a
read-mostly bucket: PUT of a bucket and of an object (single part), HEAD
and GET of an object with `Range` and `If-Match` / `If-None-Match`,
ListObjects V1 and V2 with prefix, delimiter and paging, HEAD of a bucket.
Buckets are directories under the root; an object is a file at its key.
ETags are the MD5 of the bytes (as S3's for single-part objects), kept in
memory. It checks no signature: any credentials are taken.

It must never serve a byte that is not the object's, and never listen on
anything but loopback.

Usage: dirs3.py PORT ROOT
"""

import bisect
import email.utils
import hashlib
import os
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from xml.sax.saxutils import escape

ROOT = ""
LOCK = threading.Lock()
# bucket -> {key: (etag, size, mtime)}; kept sorted on demand.
OBJECTS = {}
SORTED = {}


def load_root():
    """Objects already under the root (a restart over the same directory)."""
    for bucket in os.listdir(ROOT):
        bdir = os.path.join(ROOT, bucket)
        if not os.path.isdir(bdir):
            continue
        objs = OBJECTS.setdefault(bucket, {})
        for dirpath, _, files in os.walk(bdir):
            for f in files:
                p = os.path.join(dirpath, f)
                key = os.path.relpath(p, bdir)
                h = hashlib.md5()
                with open(p, "rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 20), b""):
                        h.update(chunk)
                st = os.stat(p)
                objs[key] = (h.hexdigest(), st.st_size, st.st_mtime)


def sorted_keys(bucket):
    with LOCK:
        keys = SORTED.get(bucket)
        if keys is None:
            keys = sorted(OBJECTS.get(bucket, {}))
            SORTED[bucket] = keys
        return keys


def past(prefix):
    """The least string after every string that starts with `prefix`."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def iso(t):
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(t))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "dirs3"

    def log_message(self, *args):
        pass

    def split(self):
        u = urllib.parse.urlsplit(self.path)
        q = dict(urllib.parse.parse_qsl(u.query, keep_blank_values=True))
        parts = urllib.parse.unquote(u.path).lstrip("/").split("/", 1)
        bucket = parts[0]
        key = parts[1] if len(parts) > 1 else ""
        return bucket, key, q

    def reply(self, code, body=b"", headers=()):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def error(self, code, s3code, msg):
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>%s</Code>'
            "<Message>%s</Message></Error>" % (s3code, escape(msg))
        ).encode()
        self.reply(code, body, [("Content-Type", "application/xml")])

    def drain(self):
        n = int(self.headers.get("Content-Length") or 0)
        data = b""
        while len(data) < n:
            chunk = self.rfile.read(n - len(data))
            if not chunk:
                break
            data += chunk
        return data

    def do_PUT(self):
        bucket, key, _ = self.split()
        body = self.drain()
        bdir = os.path.join(ROOT, bucket)
        if not key:
            os.makedirs(bdir, exist_ok=True)
            with LOCK:
                OBJECTS.setdefault(bucket, {})
            return self.reply(200)
        if bucket not in OBJECTS:
            return self.error(404, "NoSuchBucket", bucket)
        p = os.path.join(bdir, key)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        tmp = p + ".dirs3-tmp"
        with open(tmp, "wb") as fh:
            fh.write(body)
        os.replace(tmp, p)
        etag = hashlib.md5(body).hexdigest()
        with LOCK:
            OBJECTS[bucket][key] = (etag, len(body), os.stat(p).st_mtime)
            SORTED.pop(bucket, None)
        self.reply(200, headers=[("ETag", '"%s"' % etag)])

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        bucket, key, q = self.split()
        if bucket not in OBJECTS:
            return self.error(404, "NoSuchBucket", bucket)
        if not key:
            if self.command == "HEAD":
                return self.reply(200)
            return self.list(bucket, q)
        meta = OBJECTS[bucket].get(key)
        if meta is None:
            return self.error(404, "NoSuchKey", key)
        etag, size, mtime = meta
        quoted = '"%s"' % etag
        im = self.headers.get("If-Match")
        if im is not None and im.strip() not in (quoted, etag, "*"):
            return self.error(412, "PreconditionFailed", "If-Match")
        inm = self.headers.get("If-None-Match")
        if inm is not None and inm.strip() in (quoted, etag, "*"):
            return self.reply(304, headers=[("ETag", quoted)])
        start, end, code = 0, size - 1, 200
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            if a == "":
                start = max(0, size - int(b))
            else:
                start = int(a)
                end = min(size - 1, int(b)) if b else size - 1
            if start >= size:
                return self.error(416, "InvalidRange", rng)
            code = 206
        length = end - start + 1 if size else 0
        headers = [
            ("ETag", quoted),
            ("Last-Modified", email.utils.formatdate(mtime, usegmt=True)),
            ("Accept-Ranges", "bytes"),
            ("Content-Type", "application/octet-stream"),
            ("Content-Length", str(length)),
        ]
        if code == 206:
            headers.append(("Content-Range", "bytes %d-%d/%d" % (start, end, size)))
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        if self.command == "HEAD" or length == 0:
            return
        with open(os.path.join(ROOT, bucket, key), "rb") as fh:
            fh.seek(start)
            left = length
            while left > 0:
                chunk = fh.read(min(left, 1 << 20))
                if not chunk:
                    # The file shrank under us: cut the reply short, so
                    # the client sees a short body, never other bytes.
                    self.close_connection = True
                    return
                self.wfile.write(chunk)
                left -= len(chunk)

    def list(self, bucket, q):
        v2 = q.get("list-type") == "2"
        prefix = q.get("prefix", "")
        delim = q.get("delimiter", "")
        max_keys = min(int(q.get("max-keys") or 1000), 1000)
        after = q.get("continuation-token" if v2 else "marker") or q.get("start-after", "")
        keys = sorted_keys(bucket)
        objs = OBJECTS[bucket]
        if not after:
            i = bisect.bisect_left(keys, prefix)
        elif delim and after.endswith(delim):
            # The last page ended at a common prefix: past every key in it.
            i = bisect.bisect_left(keys, past(after))
        else:
            i = bisect.bisect_right(keys, after)
        contents, prefixes, last, truncated = [], [], None, False
        while i < len(keys):
            k = keys[i]
            if not k.startswith(prefix):
                break
            if len(contents) + len(prefixes) >= max_keys:
                truncated = True
                break
            rest = k[len(prefix):]
            if delim and delim in rest:
                cp = prefix + rest[: rest.index(delim) + len(delim)]
                prefixes.append(cp)
                last = cp
                # Past every key under this common prefix.
                i = bisect.bisect_left(keys, past(cp))
                continue
            contents.append(k)
            last = k
            i += 1
        if last is None:
            # max-keys=0 (mountpoint-s3 checks the bucket with it): nothing
            # listed, so nothing to continue from; S3 answers not truncated.
            truncated = False
        out = [
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">',
            "<Name>%s</Name><Prefix>%s</Prefix><MaxKeys>%d</MaxKeys>"
            % (escape(bucket), escape(prefix), max_keys),
        ]
        if delim:
            out.append("<Delimiter>%s</Delimiter>" % escape(delim))
        out.append("<IsTruncated>%s</IsTruncated>" % ("true" if truncated else "false"))
        if v2:
            out.append("<KeyCount>%d</KeyCount>" % (len(contents) + len(prefixes)))
            if truncated:
                out.append("<NextContinuationToken>%s</NextContinuationToken>" % escape(last))
        else:
            out.append("<Marker>%s</Marker>" % escape(after))
            if truncated:
                out.append("<NextMarker>%s</NextMarker>" % escape(last))
        for k in contents:
            etag, size, mtime = objs[k]
            out.append(
                "<Contents><Key>%s</Key><LastModified>%s</LastModified>"
                "<ETag>&quot;%s&quot;</ETag><Size>%d</Size>"
                "<StorageClass>STANDARD</StorageClass></Contents>"
                % (escape(k), iso(mtime), etag, size)
            )
        for p in prefixes:
            out.append("<CommonPrefixes><Prefix>%s</Prefix></CommonPrefixes>" % escape(p))
        out.append("</ListBucketResult>")
        self.reply(200, "".join(out).encode(), [("Content-Type", "application/xml")])


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024


def main():
    global ROOT
    port, ROOT = int(sys.argv[1]), sys.argv[2]
    os.makedirs(ROOT, exist_ok=True)
    load_root()
    Server(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
