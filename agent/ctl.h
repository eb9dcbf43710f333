/*
 * The agent's local control protocol (`kprof-agent capture`, `kprof-agent ps`), carried by
 * kp_wire CTL_REQUEST / CTL_REPLY on the agent's socket. One request per connection.
 *
 * Request: text, one "key=value" per line ('\n'). Keys:
 *   verb        ps | capture (required)
 *   For capture:
 *   job         the job to capture (required if processes of more than one job are registered)
 *   ranks       all (default) | a list like 0,3-5
 *   run         an existing run id; absent: the agent creates one with Control.CreateRun(job,
 *               name, world_size from the processes' WORLD_SIZE, source CAPTURE)
 *   start_step  absolute first step of the window; default: the highest current step of the
 *               selected ranks + 2, so every rank starts on the same future step. When no
 *               selected rank reports steps, the window is a time window that starts now
 *   steps       window length in steps (default 5)
 *   duration_ms window length in ms (a time window, or a cap on a step window)
 *   activities  kernel,memcpy,memset,runtime,nvtx,sync,overhead or all (default all)
 *   name        the run's name (when the agent creates it)
 *   wait        1: reply when every selected rank is done or failed and the collector has
 *               acknowledged the capture's last batch (then the run is ended with
 *               Control.EndRun if the agent created it: failed if any rank failed);
 *               0 (default): reply once the ranks are armed
 *
 * Reply: struct kp_wire_ctl_reply {status}, then text, "key=value" lines:
 *   ps:      one line per registered process, fields separated by spaces:
 *            pid= job= rank= local_rank= world= device= state= step= records= dropped= since=
 *            (since: CLOCK_REALTIME seconds of the connection; text values have no spaces)
 *   capture: run_id=N, ranks=<list>, start_step=N (or -1 for a time window), steps=N,
 *            then with wait: result=ok|failed and one "rank.<r>=done" or
 *            "rank.<r>=failed: <reason>" line per rank
 *   errors:  error=<what went wrong and what to do>
 * Status (the client's exit code): KP_CTL_* below.
 */
#ifndef KP_CTL_H
#define KP_CTL_H

enum kp_ctl_status {
    KP_CTL_OK = 0,
    KP_CTL_FAILED = 1,      /* a rank failed, the collector is unreachable, ... */
    KP_CTL_USAGE = 2,       /* a bad request (unknown verb or key, rank outside world size) */
    KP_CTL_NOT_FOUND = 3,   /* no such job, rank not registered */
    KP_CTL_BUSY = 4,        /* a selected rank is already capturing */
    KP_CTL_UNREACHABLE = 5, /* client side only: the agent's socket does not answer */
};

#define KP_CTL_DEFAULT_STEPS       5
#define KP_CTL_DEFAULT_DURATION_MS 5000
/* Steps added to the default start step while no rank's step rate is known yet (the agent has
 * seen one step report): enough for a job stepping every few ms to still be short of it. */
#define KP_CTL_UNKNOWN_RATE_MARGIN 8

#endif
