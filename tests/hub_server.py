"""A Hugging Face Hub test double on 127.0.0.1: the HTTP routes huggingface_hub and transformers call to
create a model repo and a branch, commit to it (preupload, LFS batch/upload/verify, the NDJSON commit) and
read it back (revision, tree, refs, resolve), with tokens and private repos. Storage is memory; LFS is the
only large-file protocol served: Xet's token route answers 501, as a Hub without Xet storage would.

``python tests/hub_server.py`` prints ``http://127.0.0.1:PORT`` once it listens and serves until its
standard input closes, so that it never outlives the test run that started it (killed or not).

Tokens (``Authorization: Bearer``): :data:`TOKENS` maps each to its user and whether it may write; a
token writes to its user's namespace only (another's is HTTP 403), an unknown token is 401, and a private
repo is 404 ``RepoNotFound`` to anyone but its owner, as on the Hub.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

WRITE_TOKEN = "hf_test_write_0123456789abcdef"
READ_TOKEN = "hf_test_read_0123456789abcdef"
TOKENS = {WRITE_TOKEN: ("alice", True), READ_TOKEN: ("alice", False)}
# Paths the Hub's default .gitattributes sends to LFS (of those an export holds), and any large file.
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".ckpt", ".png")
LFS_MIN_SIZE = 10 * 1024 * 1024

_REPO = r"(?P<repo>[^/]+/[^/]+)"
_REV = r"(?P<rev>[^/?]+)"


def git_oid(data: bytes) -> str:
    """The git blob id of ``data`` (what the Hub reports as a regular file's oid and ETag)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # noqa: S324 - git's own hash


def is_lfs(path: str, size: int) -> bool:
    """Whether the Hub stores ``path`` of ``size`` bytes in LFS."""
    return path.endswith(LFS_SUFFIXES) or size >= LFS_MIN_SIZE


@dataclass
class Repo:
    """A model repository: its owner's visibility setting, commits (id -> {path: content}) and branches."""

    owner: str
    private: bool
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)


class Hub:
    """The server's state: repositories and uploaded LFS objects (sha256 -> content)."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.lfs: dict[str, bytes] = {}
        self.lock = threading.Lock()

    def create(self, repo_id: str, owner: str, private: bool) -> Repo:
        """A repository with one empty commit on ``main`` (a new Hub repo has an initial commit)."""
        repo = Repo(owner, private)
        initial = hashlib.sha1(f"init {repo_id}".encode()).hexdigest()  # noqa: S324 - an id, not security
        repo.commits[initial] = {}
        repo.branches["main"] = initial
        self.repos[repo_id] = repo
        return repo


class HubError(Exception):
    """An HTTP error answer: status, JSON body and the ``X-Error-Code`` huggingface_hub reads."""

    def __init__(self, status: int, message: str, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


class Handler(BaseHTTPRequestHandler):
    """Routes a request to the ``Hub`` state of the server."""

    hub: Hub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """Quiet: the tests read the client's output, not the server's."""

    # -- plumbing ---------------------------------------------------------------------------------------

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload).encode()
        self._send(status, body, {"Content-Type": "application/json", **(headers or {})})

    def _user(self, required: bool) -> tuple[str, bool] | None:
        """The token's (user, may write); ``None`` without a token, 401 for an unknown one."""
        auth = self.headers.get("Authorization") or ""
        if not auth.startswith("Bearer "):
            if required:
                raise HubError(401, "Invalid credentials in Authorization header")
            return None
        token = auth.removeprefix("Bearer ")
        if token not in TOKENS:
            raise HubError(401, "Invalid credentials in Authorization header")
        return TOKENS[token]

    def _repo(self, repo_id: str, write: bool = False) -> Repo:
        """The repository, as the caller may see it (404 ``RepoNotFound`` when hidden or missing) and
        write it (403)."""
        user = self._user(required=write)
        repo = self.hub.repos.get(repo_id)
        if repo is None or (repo.private and (user is None or user[0] != repo.owner)):
            raise HubError(404, "Repository not found", "RepoNotFound")
        if write and (user is None or not user[1] or user[0] != repo_id.split("/")[0]):
            raise HubError(403, f"You don't have the rights to write to {repo_id}")
        return repo

    @staticmethod
    def _commit(repo: Repo, rev: str) -> str:
        """The commit id a branch name or commit id stands for (404 ``RevisionNotFound``)."""
        rev = unquote(rev)
        if rev in repo.branches:
            return repo.branches[rev]
        if rev in repo.commits:
            return rev
        raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")

    def _handle(self) -> None:
        # Read whatever was sent, even where a route ignores it: the connection is kept alive.
        self.body = self._body()
        url = urlsplit(self.path)
        path, query = unquote(url.path), url.query
        routes = [
            ("POST", r"/api/repos/create", self.create_repo),
            ("POST", r"/api/validate-yaml", self.validate_yaml),
            ("POST", rf"/api/models/{_REPO}/branch/(?P<branch>[^?]+)", self.create_branch),
            ("GET", rf"/api/models/{_REPO}/refs", self.refs),
            ("POST", rf"/api/models/{_REPO}/preupload/{_REV}", self.preupload),
            ("POST", rf"/api/models/{_REPO}/commit/{_REV}", self.commit),
            ("GET", rf"/api/models/{_REPO}/xet-(read|write)-token/.*", self.xet),
            ("GET", rf"/api/models/{_REPO}/revision/{_REV}", self.revision),
            ("GET", rf"/api/models/{_REPO}", self.revision),
            ("GET", rf"/api/models/{_REPO}/tree/{_REV}(?P<sub>/.*)?", self.tree),
            ("POST", rf"/{_REPO}\.git/info/lfs/objects/batch", self.lfs_batch),
            ("PUT", r"/lfs-upload/(?P<oid>[0-9a-f]{64})", self.lfs_upload),
            ("POST", rf"/{_REPO}\.git/info/lfs/objects/verify", self.lfs_verify),
            ("HEAD", rf"/{_REPO}/resolve/{_REV}/(?P<file>.+)", self.resolve),
            ("GET", rf"/{_REPO}/resolve/{_REV}/(?P<file>.+)", self.resolve),
        ]
        try:
            for method, pattern, handler in routes:
                match = re.fullmatch(pattern, path)
                if method == self.command and match:
                    with self.hub.lock:
                        handler(query=query, **match.groupdict())
                    return
            raise HubError(404, f"no route {self.command} {path} on this test Hub")
        except HubError as exc:
            headers = {"X-Error-Message": exc.message, **({"X-Error-Code": exc.code} if exc.code else {})}
            self._json(exc.status, {"error": exc.message}, headers)

    do_GET = do_POST = do_PUT = do_HEAD = _handle

    # -- routes -----------------------------------------------------------------------------------------

    def create_repo(self, query: str) -> None:
        user, can_write = self._user(required=True)
        body = json.loads(self.body or b"{}")
        repo_id = f"{body.get('organization') or user}/{body['name']}"
        url = f"http://{self.headers['Host']}/{repo_id}"
        if not can_write or repo_id.split("/")[0] != user:
            raise HubError(403, f"You don't have the rights to create a model under {repo_id.split('/')[0]}")
        if repo_id in self.hub.repos:
            self._json(409, {"error": "You already created this model repo", "url": url})
            return
        private = body.get("private", body.get("visibility") == "private")
        self.hub.create(repo_id, user, bool(private))
        self._json(200, {"url": url, "name": repo_id})

    def validate_yaml(self, query: str) -> None:
        self._json(200, {"errors": [], "warnings": []})

    def create_branch(self, repo: str, branch: str, query: str) -> None:
        target = self._repo(repo, write=True)
        body = json.loads(self.body or b"{}")
        if branch in target.branches:
            raise HubError(409, f"Reference already exists: refs/heads/{branch}")
        target.branches[branch] = self._commit(target, body.get("startingPoint") or "main")
        self._json(200, {})

    def refs(self, repo: str, query: str) -> None:
        target = self._repo(repo)
        branches = [
            {"name": b, "ref": f"refs/heads/{b}", "targetCommit": c} for b, c in target.branches.items()
        ]
        self._json(200, {"branches": branches, "converts": [], "tags": []})

    def preupload(self, repo: str, rev: str, query: str) -> None:
        target = self._repo(repo, write=True)
        files = self._files(target, rev)
        answer = []
        for item in json.loads(self.body)["files"]:
            path, size = item["path"], item["size"]
            lfs = is_lfs(path, size)
            old = files.get(path)
            oid = None if old is None else hashlib.sha256(old).hexdigest() if lfs else git_oid(old)
            answer.append(
                {"path": path, "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": oid}
            )
        self._json(200, {"files": answer, "commitOid": self._commit(target, rev)})

    def lfs_batch(self, repo: str, query: str) -> None:
        self._repo(repo, write=True)
        body = json.loads(self.body)
        base = f"http://{self.headers['Host']}"
        objects = []
        for item in body["objects"]:
            entry = {"oid": item["oid"], "size": item["size"]}
            if item["oid"] not in self.hub.lfs:  # present objects get no actions: nothing to upload
                entry["actions"] = {
                    "upload": {"href": f"{base}/lfs-upload/{item['oid']}"},
                    "verify": {"href": f"{base}/{repo}.git/info/lfs/objects/verify"},
                }
            objects.append(entry)
        self._json(200, {"transfer": "basic", "objects": objects})

    def lfs_upload(self, oid: str, query: str) -> None:
        data = self.body
        if hashlib.sha256(data).hexdigest() != oid:
            raise HubError(400, "uploaded content does not match its oid")
        self.hub.lfs[oid] = data
        self._send(200)

    def lfs_verify(self, repo: str, query: str) -> None:
        self._repo(repo, write=True)
        body = json.loads(self.body)
        data = self.hub.lfs.get(body["oid"])
        if data is None or len(data) != body["size"]:
            raise HubError(404, f"LFS object {body['oid']} not uploaded")
        self._json(200, {"success": True})

    def commit(self, repo: str, rev: str, query: str) -> None:
        target = self._repo(repo, write=True)
        branch = unquote(rev)
        if branch not in target.branches:
            raise HubError(404, f"Invalid rev id: {branch}", "RevisionNotFound")
        parent = target.branches[branch]
        files = dict(target.commits[parent])
        header: dict[str, Any] = {}
        for line in self.body.splitlines():
            item = json.loads(line)
            key, value = item["key"], item["value"]
            if key == "header":
                header = value
            elif key == "file":
                files[value["path"]] = base64.b64decode(value["content"])
            elif key == "lfsFile":
                if value["oid"] not in self.hub.lfs:
                    raise HubError(422, f"LFS object {value['oid']} of {value['path']} was not uploaded")
                files[value["path"]] = self.hub.lfs[value["oid"]]
            elif key in ("deletedFile", "deletedFolder"):
                prefix = value["path"].rstrip("/")
                files = {p: d for p, d in files.items() if p != prefix and not p.startswith(prefix + "/")}
        if header.get("parentCommit") not in (None, parent):
            raise HubError(412, "A commit has happened since the parent commit")
        listing = json.dumps({p: git_oid(d) for p, d in sorted(files.items())})
        oid = hashlib.sha1(f"{parent}\n{header.get('summary')}\n{listing}".encode()).hexdigest()  # noqa: S324
        target.commits[oid] = files
        target.branches[branch] = oid
        url = f"http://{self.headers['Host']}/{repo}/commit/{oid}"
        self._json(200, {"success": True, "commitOid": oid, "commitUrl": url, "pullRequestUrl": None})

    def xet(self, repo: str, query: str) -> None:
        self._repo(repo)
        raise HubError(501, "Xet storage is not served by this Hub")

    def _files(self, repo: Repo, rev: str) -> dict[str, bytes]:
        return repo.commits[self._commit(repo, rev)]

    def revision(self, repo: str, query: str, rev: str = "main") -> None:
        target = self._repo(repo)
        sha = self._commit(target, rev)
        siblings = [{"rfilename": p} for p in sorted(target.commits[sha])]
        self._json(
            200, {"id": repo, "modelId": repo, "sha": sha, "private": target.private, "siblings": siblings}
        )

    def tree(self, repo: str, rev: str, query: str, sub: str | None = None) -> None:
        target = self._repo(repo)
        prefix = (sub or "").strip("/")
        entries = []
        for path, data in sorted(self._files(target, rev).items()):
            if prefix and not path.startswith(prefix + "/"):
                continue
            entry: dict[str, Any] = {"type": "file", "path": path, "size": len(data), "oid": git_oid(data)}
            if is_lfs(path, len(data)):
                entry["lfs"] = {
                    "oid": hashlib.sha256(data).hexdigest(),
                    "size": len(data),
                    "pointerSize": 134,
                }
            entries.append(entry)
        self._json(200, entries)

    def resolve(self, repo: str, rev: str, file: str, query: str) -> None:
        target = self._repo(repo)
        sha = self._commit(target, rev)
        data = target.commits[sha].get(file)
        if data is None:
            raise HubError(404, f"Entry not found: {file}", "EntryNotFound")
        headers = {
            "X-Repo-Commit": sha,
            "ETag": f'"{git_oid(data)}"',
            "Content-Type": "application/octet-stream",
        }
        if is_lfs(file, len(data)):
            headers |= {
                "X-Linked-Etag": f'"{hashlib.sha256(data).hexdigest()}"',
                "X-Linked-Size": str(len(data)),
            }
        self._send(200, data, headers)


def serve(port: int = 0) -> ThreadingHTTPServer:
    """A server on 127.0.0.1:``port`` (0: any free port) with an empty Hub, serving in a daemon thread."""
    handler = type("BoundHandler", (Handler,), {"hub": Hub()})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


if __name__ == "__main__":
    running = serve()
    print(f"http://127.0.0.1:{running.server_address[1]}", flush=True)
    sys.stdin.read()  # until the test run that started it closes the pipe (or dies)
    running.shutdown()
