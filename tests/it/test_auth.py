#!/usr/bin/env python3
"""it.test_auth: authentication and authorization of kprof-collectord and kprof-analyzer over
real TLS (a throwaway CA made with openssl), a token file and a client CA, driven by grpcio.

  matrix      every method of Control, Ingest and Analyzer x (no token, a wrong token, an
              expired token, a token rotated out of the file, each role's token, an agent's
              client certificate, a certificate of another CA, a plaintext client to the TLS
              port): UNAUTHENTICATED, PERMISSION_DENIED, or for a call the role may make a
              status that is neither (a dummy request: NOT_FOUND, INVALID_ARGUMENT or OK); after
              each call both daemons still answer a viewer
  rotation    the token file is rewritten without a token: that token is refused within a few
              seconds (polled), the new one works, without a restart
  logs        every refusal is logged with the peer; no log holds any token
  agents      (grpcio playing kprof-agent) an agent identity claiming another node's host, or an
              agent id another identity attached, is refused PERMISSION_DENIED (a shared token,
              NAME "*", speaks for any host but not with another's agent id); rank states it
              reports for ranks it does not host are ignored (counted on /metrics); a push into
              a capture rank of another agent, into another agent's run or (as operator) into
              a capture's run is refused PERMISSION_DENIED naming the run, what was acked
              before on that stream stays stored; EndRun of another's run is refused; the
              legit agent's capture completes with its ranks DONE; after a collectord restart
              an agent's resend into its own run is taken (runs.created_by, migration 0011)
"""
import json
import os
import re
import time

import kpfix

kpfix.require_env()

import grpc  # noqa: E402
import kprof_pb2 as pb  # noqa: E402

SC = grpc.StatusCode
DB = "kp_it_auth"
JOB = "ddp-auth"
RS = pb.RankState
DENIED = (SC.UNAUTHENTICATED, SC.PERMISSION_DENIED)

TOK = {
    "agent": "agent-node-a-token-0123456789abcdef",
    "agent_b": "agent-node-b-token-0123456789abcdef",
    "shared": "agent-shared-token-any-node-012345",
    "viewer": "viewer-token-0123456789abcdef",
    "operator": "operator-token-0123456789abcdef",
    "expired": "expired-operator-token-0123456789",
    "old": "old-operator-token-to-rotate-0123",
    "new": "new-operator-token-after-rotation0",
    "wrong": "not-a-token-of-the-file-0123456789",
}

AGENT, VIEWER, OPERATOR = "agent", "viewer", "operator"

# path -> (kind, request class, response class, roles allowed)
CONTROL = {
    "Attach": ("stream", pb.AgentReport, pb.CaptureCommand, {AGENT}),
    "ListJobs": ("unary", pb.ListJobsRequest, pb.ListJobsResponse, {VIEWER, OPERATOR}),
    "StartCapture": ("unary", pb.StartCaptureRequest, pb.Capture, {OPERATOR}),
    "StopCapture": ("unary", pb.StopCaptureRequest, pb.Capture, {OPERATOR}),
    "CaptureStatus": ("unary", pb.CaptureStatusRequest, pb.CaptureStatusResponse,
                      {VIEWER, OPERATOR}),
    "CreateRun": ("unary", pb.CreateRunRequest, pb.Run, {AGENT, OPERATOR}),
    "EndRun": ("unary", pb.EndRunRequest, pb.Run, {AGENT, OPERATOR}),
    "ListRuns": ("unary", pb.ListRunsRequest, pb.ListRunsResponse, {VIEWER, OPERATOR}),
    "DropRun": ("unary", pb.DropRunRequest, pb.Run, {OPERATOR}),
}
INGEST = {"Push": ("stream", pb.Batch, pb.Ack, {AGENT, OPERATOR})}
ANALYZER = {m: ("unary", getattr(pb, m + "Request"), getattr(pb, m + "Response"),
                {VIEWER, OPERATOR})
            for m in ("Breakdown", "Ops", "Kernels", "Prof", "Roofline", "Counters", "Compare",
                      "Hta", "Memory", "Distributed", "Diff")}
ANALYZER["Export"] = ("server_stream", pb.ExportRequest, pb.ExportChunk, {VIEWER, OPERATOR})
ANALYZER["ProfRows"] = ("server_stream", pb.ProfRequest, pb.ProfPage, {VIEWER, OPERATOR})


def call(ch, service, method, spec, md, timeout=15):
    """One call of method with a dummy request; returns its status code."""
    kind, req, resp = spec[0], spec[1], spec[2]
    path = "/kprof.v1.%s/%s" % (service, method)
    try:
        if kind == "unary":
            ch.unary_unary(path, request_serializer=req.SerializeToString,
                           response_deserializer=resp.FromString)(req(), metadata=md,
                                                                  timeout=timeout)
        elif kind == "server_stream":
            list(ch.unary_stream(path, request_serializer=req.SerializeToString,
                                 response_deserializer=resp.FromString)(req(), metadata=md,
                                                                        timeout=timeout))
        else:
            list(ch.stream_stream(path, request_serializer=req.SerializeToString,
                                  response_deserializer=resp.FromString)(iter([req()]),
                                                                         metadata=md,
                                                                         timeout=timeout))
    except grpc.RpcError as e:
        return e.code()
    return SC.OK


def batch(run_id, rank, seq, stream=7, n=3):
    b = pb.Batch(run_id=run_id, rank=rank, stream=stream, seq=seq,
                 base_ns=int(time.time() * 1e9) - 10_000_000_000)
    b.strings.extend(["", "volta_sgemm_128x64_nn"])
    k = b.kernels
    k.start_ns.extend([1000 * (i + 1) for i in range(n)])
    k.dur_ns.extend([10 + i for i in range(n)])
    k.name.extend([1] * n)
    k.grid_x.extend([80] * n)
    return b


def push(ch, md, batches):
    """Pushes batches on one stream: (acked (run, rank, seq) list, status code, details)."""
    stub = ch.stream_stream("/kprof.v1.Ingest/Push", request_serializer=pb.Batch.SerializeToString,
                            response_deserializer=pb.Ack.FromString)
    acked = []
    try:
        for ack in stub(iter(batches), metadata=md, timeout=30):
            acked += [(r.run_id, r.rank, r.seq) for r in ack.batches]
    except grpc.RpcError as e:
        return acked, e.code(), e.details()
    return acked, SC.OK, ""


def unary(ch, method, req, resp, md):
    return ch.unary_unary("/kprof.v1.Control/" + method, request_serializer=req.SerializeToString,
                          response_deserializer=resp.FromString)


def code_of(fn):
    try:
        return fn(), SC.OK, ""
    except grpc.RpcError as e:
        return None, e.code(), e.details()


def Agent(ch, md, host, agent_id, ranks=()):
    return kpfix.AttachAgent(ch, md, host, agent_id, JOB, ranks=ranks, world=2)


def token_lines(now, rotated):
    past = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 3600))
    lines = ["# kprof tokens (it.test_auth)",
             "agent node-a " + TOK["agent"],
             "",
             "agent node-b " + TOK["agent_b"],
             "agent * " + TOK["shared"],
             "viewer dash " + TOK["viewer"],
             "operator alice " + TOK["operator"],
             "operator late %s expires=%s" % (TOK["expired"], past)]
    lines.append("operator rot " + (TOK["new"] if rotated else TOK["old"]))
    return lines


def check_matrix(cd, an, pki, creds, healthy):
    """Every method x every credential in creds: {label: (channel, metadata, role or None)}."""
    seen = 0
    for label, (ch, md, role) in creds.items():
        for service, table, daemon in (("Control", CONTROL, cd), ("Ingest", INGEST, cd),
                                       ("Analyzer", ANALYZER, an)):
            for method, spec in table.items():
                got = call(ch(daemon), service, method, spec, md)
                if role is None:
                    want_ok = False
                    expect = {"plaintext": SC.UNAVAILABLE,
                              "other_ca": SC.UNAVAILABLE}.get(label, SC.UNAUTHENTICATED)
                    ok = got == expect
                elif role in spec[3]:
                    want_ok = True
                    ok = got not in DENIED and got != SC.UNAVAILABLE
                else:
                    want_ok = False
                    ok = got == SC.PERMISSION_DENIED
                assert ok, "%s %s/%s: got %s (allowed: %s)" % (label, service, method, got,
                                                               want_ok)
                healthy()
                seen += 1
    return seen


def test_matrix_and_rotation(cd, an, pki, tokfile):
    chans = {}

    def tls(cert=None, root=None):
        def make(d):
            key = (d.grpc, cert, root)
            if key not in chans:
                chans[key] = kpfix.channel(d.grpc, pki, cert=cert, root=root)
            return chans[key]
        return make

    def plain(d):
        key = (d.grpc, "plain")
        if key not in chans:
            chans[key] = kpfix.channel(d.grpc)
        return chans[key]

    viewer = kpfix.bearer(TOK["viewer"])
    hc, ha = kpfix.channel(cd.grpc, pki), kpfix.channel(an.grpc, pki)

    def healthy():
        assert call(hc, "Control", "ListRuns", CONTROL["ListRuns"], viewer) == SC.OK
        assert call(ha, "Analyzer", "Ops", ANALYZER["Ops"], viewer) not in DENIED + (
            SC.UNAVAILABLE,)
        assert cd.proc.poll() is None and an.proc.poll() is None

    agent_cert = pki.client("agent", "node-a")
    other_cert = pki.other_client("operator", "mallory")
    creds = {
        "none": (tls(), [], None),
        "wrong": (tls(), kpfix.bearer(TOK["wrong"]), None),
        "expired": (tls(), kpfix.bearer(TOK["expired"]), None),
        "malformed": (tls(), [("authorization", "Basic " + TOK["operator"])], None),
        "agent": (tls(), kpfix.bearer(TOK["agent"]), AGENT),
        "viewer": (tls(), viewer, VIEWER),
        "operator": (tls(), kpfix.bearer(TOK["operator"]), OPERATOR),
        "agent_cert": (tls(cert=agent_cert), [], AGENT),
        "other_ca": (tls(cert=other_cert), [], None),
        "plaintext": (plain, kpfix.bearer(TOK["operator"]), None),
        "old_before_rotation": (tls(), kpfix.bearer(TOK["old"]), OPERATOR),
    }
    n = check_matrix(cd, an, pki, creds, healthy)

    # rotation: rewrite the file without the old token; poll until it is refused
    kpfix.write_tokens(tokfile, token_lines(time.time(), rotated=True))
    old, new = kpfix.bearer(TOK["old"]), kpfix.bearer(TOK["new"])
    for d, svc, m, spec in ((cd, "Control", "ListRuns", CONTROL["ListRuns"]),
                            (an, "Analyzer", "Ops", ANALYZER["Ops"])):
        kpfix.wait_for(lambda: call(tls()(d), svc, m, spec, old) == SC.UNAUTHENTICATED, 5,
                       "the rotated-out token to be refused by " + svc)
        assert call(tls()(d), svc, m, spec, new) not in DENIED
    n += check_matrix(cd, an, pki, {"rotated_out": (tls(), old, None),
                                    "new_after_rotation": (tls(), new, OPERATOR)}, healthy)
    for c in list(chans.values()) + [hc, ha]:
        c.close()
    print("matrix: %d calls over %d methods, each answered as its credential deserves; the "
          "rotated-out token refused within 5 s, the new one taken" %
          (n, len(CONTROL) + len(INGEST) + len(ANALYZER)))


def test_logs(cd, an, pki):
    """Refusals are logged (at most 10 lines a second: the matrix's burst may have used a
    second's lines, so one more refusal of each kind is made once that second is over)."""
    time.sleep(1.1)
    for d, svc, method, spec in ((cd, "Control", "DropRun", CONTROL["DropRun"]),
                                 (an, "Analyzer", "Ops", ANALYZER["Ops"])):
        ch = kpfix.channel(d.grpc, pki)
        assert call(ch, svc, method, spec, kpfix.bearer(TOK["agent_b"])) == SC.PERMISSION_DENIED
        assert call(ch, svc, method, spec, kpfix.bearer(TOK["wrong"])) == SC.UNAUTHENTICATED
        ch.close()
        pat = re.compile(r"refused status=(UNAUTHENTICATED|PERMISSION_DENIED) method=\S+ "
                         r"peer=ipv4:127\.0\.0\.1:\d+ reason=")

        def logged():
            text = d.log_text()
            return ("status=PERMISSION_DENIED method=/kprof.v1.%s/%s" % (svc, method) in text
                    and "status=UNAUTHENTICATED method=/kprof.v1.%s/%s" % (svc, method) in text)
        kpfix.wait_for(logged, 5, "the refusals in the log of " + svc)
        text = d.log_text()
        for t in TOK.values():
            assert t not in text, "a token in the log of " + d.log_path
        lines = [l for l in text.splitlines() if " rpc: refused " in l]
        assert lines and all(pat.search(l) for l in lines), lines[:3]
    print("logs: refusals logged with the peer; no token in either log")


def test_agents(cd, pki):
    ch = kpfix.channel(cd.grpc, pki)
    a_md, b_md = kpfix.bearer(TOK["agent"]), kpfix.bearer(TOK["agent_b"])
    op_md, view_md = kpfix.bearer(TOK["operator"]), kpfix.bearer(TOK["viewer"])

    legit = Agent(ch, a_md, "node-a", 0xA1, ranks=(0, 1))
    kpfix.wait_for(lambda: "agent attached host=node-a" in cd.log_text(), 10, "node-a attached")

    # another node's host, and another identity's agent id
    liar = Agent(ch, b_md, "node-a", 0xB1)
    code, details = liar.wait_end()
    assert code == SC.PERMISSION_DENIED and "node-b" in details and "node-a" in details, details
    thief = Agent(ch, b_md, "node-b", 0xA1)
    code, details = thief.wait_end()
    assert code == SC.PERMISSION_DENIED and "agent_id" in details, details
    assert not legit.done, "the legit agent's call ended"

    # a shared token (NAME "*") speaks for any host, but not with node-a's agent id
    shared = Agent(ch, kpfix.bearer(TOK["shared"]), "node-z", 0xC1)
    kpfix.wait_for(lambda: "agent attached host=node-z" in cd.log_text(), 10, "node-z attached")
    assert not shared.done
    shared.close()
    thief2 = Agent(ch, kpfix.bearer(TOK["shared"]), "node-a", 0xA1)
    code, details = thief2.wait_end()
    assert code == SC.PERMISSION_DENIED and "agent_id" in details, details

    assert cd.metric("kprof_collectord_attach_refused_total") == 3

    # node-b attaches honestly (no process of the job)
    other = Agent(ch, b_md, "node-b", 0xB2)

    # operator starts a capture on node-a's ranks
    start = unary(ch, "StartCapture", pb.StartCaptureRequest, pb.Capture, op_md)
    cap = start(pb.StartCaptureRequest(job=JOB, ranks="all", steps=2, deadline_ms=60000),
                metadata=op_md, timeout=30)
    run = cap.run.id
    legit.wait_arm(run)
    assert kpfix.psql("SELECT created_by FROM runs WHERE id = %d" % run, db=DB) == \
        "operator:alice"
    assert kpfix.psql("SELECT string_agg(agent_by, ',' ORDER BY rank) FROM capture_ranks "
                      "WHERE run_id = %d" % run, db=DB) == "agent:node-a,agent:node-a"

    # node-b reports rank 0 DONE: ignored, counted
    before = cd.metric("kprof_collectord_foreign_rank_reports_total")
    other.set_state(run, 0, RS.RANK_STATE_DONE)
    kpfix.wait_for(lambda: cd.metric("kprof_collectord_foreign_rank_reports_total") > before,
                   10, "the foreign report counted")
    status = unary(ch, "CaptureStatus", pb.CaptureStatusRequest, pb.CaptureStatusResponse,
                   view_md)
    st = status(pb.CaptureStatusRequest(run_id=run), metadata=view_md, timeout=30)
    assert [r.state for r in st.captures[0].ranks] == [RS.RANK_STATE_PENDING] * 2, st
    assert "rank(s) it does not host" in cd.log_text()

    # node-b's own run (CreateRun) takes its batches; then a push into node-a's capture rank is
    # refused naming the run, and what was acked before stays
    create = unary(ch, "CreateRun", pb.CreateRunRequest, pb.Run, b_md)
    b_run = create(pb.CreateRunRequest(job="b-local", world_size=1), metadata=b_md,
                   timeout=30).id
    acked, code, details = push(ch, b_md, [batch(b_run, 0, 1), batch(run, 0, 1)])
    assert code == SC.PERMISSION_DENIED and str(run) in details, (code, details)
    kpfix.wait_for(lambda: kpfix.psql("SELECT count(*) FROM ingest_batches WHERE run_id = %d"
                                      % b_run, db=DB) == "1", 10, "node-b's first batch stored")
    assert kpfix.psql("SELECT count(*) FROM ingest_batches WHERE run_id = %d" % run,
                      db=DB) == "0"

    # operator into a capture's run, agent into another agent's run, agent into an operator's
    for md, r, who in ((op_md, run, "operator"), (a_md, b_run, "node-a into node-b's run")):
        _, code, details = push(ch, md, [batch(r, 0, 9)])
        assert code == SC.PERMISSION_DENIED and ("run %d" % r) in details, (who, code, details)
    op_run = unary(ch, "CreateRun", pb.CreateRunRequest, pb.Run, op_md)(
        pb.CreateRunRequest(job="import", world_size=1, source=pb.RUN_SOURCE_IMPORT),
        metadata=op_md, timeout=30).id
    _, code, details = push(ch, a_md, [batch(op_run, 0, 1)])
    assert code == SC.PERMISSION_DENIED and str(op_run) in details, details
    acked, code, _ = push(ch, op_md, [batch(op_run, 0, 1)])
    assert code == SC.OK and acked == [(op_run, 0, 1)], (code, acked)
    # a second operator identity may push into an import too (runs an operator created)
    kpfix.wait_for(lambda: kpfix.psql("SELECT created_by FROM runs WHERE id = %d" % op_run,
                                      db=DB) == "operator:alice", 5, "import run's creator")

    # a run of source CAPTURE whose capture rows are not written yet (StartCapture writes them
    # after the run): decided as it is then, not remembered, so the capture's agent is taken
    # once its rows are there
    early = unary(ch, "CreateRun", pb.CreateRunRequest, pb.Run, op_md)(
        pb.CreateRunRequest(job=JOB, world_size=1, source=pb.RUN_SOURCE_CAPTURE),
        metadata=op_md, timeout=30).id
    acked, code, _ = push(ch, op_md, [batch(early, 0, 1)])
    assert code == SC.OK and acked == [(early, 0, 1)], (code, acked)
    kpfix.psql("INSERT INTO captures (run_id, start_step, steps, duration_ms, activities, "
               "deadline_at) VALUES (%d, 1, 1, 0, 'all', now() + interval '1 hour'); "
               "INSERT INTO capture_ranks (run_id, rank, state, host, agent_by) VALUES "
               "(%d, 0, 1, 'node-a', 'agent:node-a')" % (early, early), db=DB)
    acked, code, details = push(ch, a_md, [batch(early, 0, 2)])
    assert code == SC.OK and acked == [(early, 0, 2)], (code, details, acked)
    _, code, _ = push(ch, op_md, [batch(early, 0, 3)])
    assert code == SC.PERMISSION_DENIED, code

    # EndRun: node-a may not end node-b's run, nor the capture's; node-b ends its own
    end_a = unary(ch, "EndRun", pb.EndRunRequest, pb.Run, a_md)
    for r in (b_run, run):
        _, code, details = code_of(lambda: end_a(pb.EndRunRequest(run_id=r), metadata=a_md,
                                                 timeout=30))
        assert code == SC.PERMISSION_DENIED and str(r) in details, (r, code, details)
    ended_b = unary(ch, "EndRun", pb.EndRunRequest, pb.Run, b_md)(
        pb.EndRunRequest(run_id=b_run), metadata=b_md, timeout=30)
    assert ended_b.state == pb.RUN_STATE_ENDED, ended_b

    # the legit capture: node-a pushes its ranks and reports them done
    acked, code, details = push(ch, a_md, [batch(run, 0, 1), batch(run, 1, 1)])
    assert code == SC.OK and sorted(acked) == [(run, 0, 1), (run, 1, 1)], (code, details, acked)
    for rank in (0, 1):
        legit.set_state(run, rank, RS.RANK_STATE_DONE)

    def ended():
        c = status(pb.CaptureStatusRequest(run_id=run), metadata=view_md, timeout=30).captures[0]
        return c if c.run.state == pb.RUN_STATE_ENDED else None
    c = kpfix.wait_for(ended, 20, "the legit capture to end")
    assert [r.state for r in c.ranks] == [RS.RANK_STATE_DONE] * 2, c
    for a in (legit, other):
        a.close()

    # node-a's own run, resent after a collectord restart (created_by is persisted)
    a_run = unary(ch, "CreateRun", pb.CreateRunRequest, pb.Run, a_md)(
        pb.CreateRunRequest(job="a-local", world_size=1), metadata=a_md, timeout=30).id
    acked, code, _ = push(ch, a_md, [batch(a_run, 0, 1)])
    assert code == SC.OK and acked == [(a_run, 0, 1)]
    ch.close()
    return a_run


def main():
    tmp = os.path.join(kpfix.TEST_DIR, "auth")
    pki = kpfix.make_pki(os.path.join(tmp, "pki"))
    tokfile = kpfix.write_tokens(os.path.join(tmp, "tokens"),
                                 token_lines(time.time(), rotated=False))
    conninfo = kpfix.fresh_db(DB)
    cd = kpfix.Collectord("auth-collectord", conninfo, secure=(pki, tokfile))
    an = kpfix.Analyzer("auth-analyzer", conninfo, secure=(pki, tokfile))
    try:
        test_matrix_and_rotation(cd, an, pki, tokfile)
        a_run = test_agents(cd, pki)
        test_logs(cd, an, pki)
        assert cd.stop() == 0
        cd = kpfix.Collectord("auth-collectord2", conninfo, secure=(pki, tokfile))
        ch = kpfix.channel(cd.grpc, pki)
        acked, code, details = push(ch, kpfix.bearer(TOK["agent"]), [batch(a_run, 0, 1),
                                                                      batch(a_run, 0, 2)])
        assert code == SC.OK and acked == [(a_run, 0, 1), (a_run, 0, 2)], (code, details)
        _, code, details = push(ch, kpfix.bearer(TOK["agent_b"]), [batch(a_run, 0, 3)])
        assert code == SC.PERMISSION_DENIED, (code, details)
        ch.close()
        print("agents: foreign host, foreign agent id, foreign ranks, foreign runs refused; the "
              "legit capture completed; an agent's resend into its run taken after a restart")
    finally:
        for d in (cd, an):
            d.stop()
            d.assert_clean_log()
    print(json.dumps({"ok": True}))


if __name__ == "__main__":
    main()
