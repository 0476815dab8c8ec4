#!/usr/bin/env python3
"""Runs ON the rig (or in the controller's process): one streaming completion, timed where the client sits.

Reads one JSON request on stdin: {"url": ".../v1/completions", "body": {...}, "connect_timeout_s": 10,
"timeout_s": 900, "overhead_model": optional, "headers": optional (e.g. an endpoint's Authorization)}; prints one JSON line: when the first and last token events
arrived (seconds after the request started), the usage, the text, the number of token events, the generated
tokens' logprobs when the body asked for them (vLLM's completion logprobs: tokens, token_logprobs, top_logprobs,
joined over the events), and an error when the request broke. With "overhead_model" (a name the server does not serve), the same body is first sent
under that name and the time until its 404 is read is reported as "overhead_s": the API server's cost of
receiving, parsing and answering this request with no engine work (see api_overhead).
Run on the rig by its own python3 over SSH, the TTFT it reports is the one the rig's own clients see on its
loopback, without the controller's tunnel. Standard library only (a rig has python3, nothing more is promised).
"""

import http.client
import json
import socket
import sys
import time
import urllib.parse

HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}


def _connection(url, connect_timeout_s):
    parts = urllib.parse.urlsplit(url)
    factory = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = factory(parts.hostname, parts.port, timeout=connect_timeout_s)
    return connection, (parts.path or "/") + ("?" + parts.query if parts.query else "")


def stream(url, body, connect_timeout_s, timeout_s, headers=None):
    """POST `body` to `url` as a server-sent event stream; the timings are measured here, by this process, from
    just before the connection (the body is encoded first: a long prompt's JSON is the client's cost, not TTFT)."""
    payload = json.dumps(body).encode()
    start = time.monotonic()
    first = last = None
    events, pieces, usage = 0, [], {}
    logprobs = {"tokens": [], "token_logprobs": [], "top_logprobs": []}
    status, error, timed_out = None, None, False
    connection, path = _connection(url, connect_timeout_s)
    try:
        connection.connect()
        connection.sock.settimeout(timeout_s)  # from now on: the longest silence the stream may keep
        connection.request("POST", path, body=payload,
                           headers=dict(HEADERS, **(headers or {})))
        response = connection.getresponse()
        status = response.status
        if status != 200:
            return {"status": status, "error_body": response.read(300).decode("utf-8", "replace"),
                    "total_s": time.monotonic() - start}
        done = False
        while not done:
            line = response.readline()
            if not line:
                # http.client reads a chunked stream cut mid-way as a plain end: only [DONE] says it is complete
                error = "stream closed before [DONE] (the server dropped the connection)"
                break
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            done = data == b"[DONE]"
            if done:
                continue
            event = json.loads(data)
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", []):
                # every token event counts, even one whose text is empty (a partial UTF-8 sequence):
                # timing only non-empty text skews decode speed
                now = time.monotonic() - start
                first = now if first is None else first
                last = now
                events += 1
                pieces.append(choice.get("text") or "")
                for key, values in (choice.get("logprobs") or {}).items():
                    if key in logprobs:
                        logprobs[key] += values or []
    except socket.timeout:
        error, timed_out = "timeout: no data for %g s (client gave up)" % timeout_s, True
    except (OSError, http.client.HTTPException, ValueError) as exc:
        error = "%s: %s" % (type(exc).__name__, exc)
    finally:
        connection.close()
    return {"status": status, "first_token_s": first, "last_token_s": last, "total_s": time.monotonic() - start,
            "events": events, "text": "".join(pieces), "usage": usage, "error": error, "timed_out": timed_out,
            "logprobs": logprobs if logprobs["tokens"] else None}


# overhead requests per measured request, their median taken: one sample strays by a few ms on a busy host
OVERHEAD_SAMPLES = 3


def api_overhead(url, body, model, connect_timeout_s, samples=OVERHEAD_SAMPLES, headers=None):
    """The median over `samples` requests of the seconds from just before the connection until the server's
    refusal of `body` sent under `model`, a name it does not serve, is read: {"overhead_s": s, "overhead_samples_s":
    [...]} when each was a 404, else {"overhead_s": None, "overhead_error": why}.

    vLLM reads and validates the whole body (CompletionRequest) before its serving layer checks the model name,
    and the check comes before the renderer stamps the request's arrival time, the start of
    vllm:time_to_first_token_seconds (vllm 0.32: entrypoints/openai/completion/serving.py checks the model first,
    renderers/base.py sets arrival_time): a 404 costs the HTTP and parsing a real request pays outside the
    histogram's clock, with no engine work and no metric moving."""
    payload = json.dumps(dict(body, model=model)).encode()
    timings = []
    for _ in range(samples):
        start = time.monotonic()
        connection, path = _connection(url, connect_timeout_s)
        try:
            connection.connect()
            connection.request("POST", path, body=payload,
                               headers=dict(HEADERS, **(headers or {})))
            response = connection.getresponse()
            response.read()
            timings.append(time.monotonic() - start)
        except (OSError, http.client.HTTPException) as exc:
            return {"overhead_s": None, "overhead_error": "%s: %s" % (type(exc).__name__, exc)}
        finally:
            connection.close()
        if response.status != 404:
            return {"overhead_s": None,
                    "overhead_error": "the server answered %d, not 404, for model %r" % (response.status, model)}
    return {"overhead_s": sorted(timings)[len(timings) // 2], "overhead_samples_s": timings}


def probe(request):
    """The answer to one request (the stdin JSON the module docstring describes)."""
    connect_timeout_s = float(request["connect_timeout_s"])
    overhead, headers = {}, request.get("headers")
    if request.get("overhead_model"):
        overhead = api_overhead(request["url"], request["body"], request["overhead_model"], connect_timeout_s,
                                headers=headers)
    result = stream(request["url"], request["body"], connect_timeout_s, float(request["timeout_s"]), headers)
    result.update(overhead)
    return result


def main():
    print(json.dumps(probe(json.loads(sys.stdin.read()))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
