"""tools/slurm_train.sh's decisions after srun returns: requeue, start again, or stop.

No Slurm here: ``srun`` and ``scontrol`` are small scripts on PATH that play a
scheduler's part (the status srun returns, what the tasks left in the work dir) and
record how they were called.  The marker the script reads is written by the real
PreemptionHook (tests/test_fault_tolerance.py checks that side).
"""
import os
import stat
import subprocess
import textwrap

import pytest

from inline_mm.engine import PREEMPTED_EXIT_CODE, PREEMPTED_MARKER

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLURM_TRAIN = os.path.join(REPO_ROOT, 'tools', 'slurm_train.sh')

#: fake srun: its n-th start (counted in $CALLS) does what the n-th word of $SRUN_PLAN
#: says: 'ok' exits 0, 'fail' exits 1, 'killed' exits 137 (a task killed by SIGKILL, what
#: srun returns after --kill-on-bad-exit), 'preempted-killed' writes the marker the way
#: rank 0 does and exits 137, 'preempted' writes it and exits 75
FAKE_SRUN = textwrap.dedent('''\
    #!/usr/bin/env bash
    echo "$@" >> "$CALLS"
    n=$(wc -l < "$CALLS")
    prev=""
    for arg in "$@"; do  # the tasks start in --chdir / -D
      [[ "$prev" == --chdir || "$prev" == -D ]] && cd "$arg"
      [[ "$arg" == --chdir=* ]] && cd "${arg#--chdir=}"
      [[ "$arg" == -D?* ]] && cd "${arg#-D}"
      prev=$arg
    done
    what=$(echo $SRUN_PLAN | cut -d' ' -f"$n")
    prev=""
    for arg in "$@"; do  # the last --work-dir wins, as in argparse
      [[ "$prev" == --work-dir ]] && work=$arg
      [[ "$arg" == --work-dir=* ]] && work=${arg#--work-dir=}
      prev=$arg
    done
    marker() { echo "preempted after iteration 5: $work/iter_5.pth" > "$work/preempted"; }
    case "$what" in
      ok) exit 0 ;;
      fail) exit 1 ;;
      killed) exit 137 ;;
      preempted-killed) marker; exit 137 ;;
      preempted) marker; exit 75 ;;
    esac
    exit 99
''')

FAKE_SCONTROL = textwrap.dedent('''\
    #!/usr/bin/env bash
    echo "$@" >> "$REQUEUES"
''')


def slurm_train(tmp_path, plan, job_id=None, stale_marker=False, args=(), work_dir=None,
                srun_args=''):
    """Run the script with the fake scheduler; returns (process, srun calls, requeues).

    ``work_dir``: the WORK_DIR argument (default: the absolute ``tmp_path / 'work'``);
    ``srun_args``: SRUN_ARGS.
    """
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    for name, text in (('srun', FAKE_SRUN), ('scontrol', FAKE_SCONTROL)):
        path = bin_dir / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    work = tmp_path / 'work'
    work.mkdir()
    if stale_marker:
        (work / PREEMPTED_MARKER).write_text('an earlier preemption\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith('SLURM_')}
    env.update(PATH=f'{bin_dir}:{env["PATH"]}', CALLS=str(tmp_path / 'calls'),
               REQUEUES=str(tmp_path / 'requeues'), SRUN_PLAN=plan, MAX_RESTARTS='3',
               SRUN_ARGS=srun_args)
    if job_id is not None:
        env['SLURM_JOB_ID'] = job_id
    proc = subprocess.run(['bash', SLURM_TRAIN, 'part', 'job', 'configs/x.py',
                           str(work) if work_dir is None else work_dir, *args],
                          capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)

    def lines(name):
        path = tmp_path / name
        return path.read_text().splitlines() if path.exists() else []

    return proc, lines('calls'), lines('requeues')


@pytest.mark.parametrize('plan', ['preempted', 'preempted-killed'])
def test_a_preempted_job_is_requeued_even_when_srun_reports_a_signal(tmp_path, plan):
    """Rank 0's marker makes a 137 from srun (the other tasks killed after the first exited
    with 75) a preemption: the job is requeued and the script exits with 75."""
    proc, calls, requeues = slurm_train(tmp_path, plan, job_id='4242')
    assert proc.returncode == PREEMPTED_EXIT_CODE, proc.stderr
    assert requeues == ['requeue 4242']
    assert len(calls) == 1 and calls[0].endswith('--resume')
    if plan == 'preempted-killed':
        assert 'srun returned 137; the run had stopped for a preemption: preempted after ' \
               'iteration 5' in proc.stderr


def test_a_killed_job_without_a_marker_is_not_requeued(tmp_path):
    """A 137 with no marker is a failure: the script exits with it and requeues nothing,
    also when an earlier start's marker was left in the work dir (removed before srun)."""
    proc, calls, requeues = slurm_train(tmp_path, 'killed', job_id='4242', stale_marker=True)
    assert proc.returncode == 137, proc.stderr
    assert requeues == [] and len(calls) == 1
    assert not (tmp_path / 'work' / PREEMPTED_MARKER).exists()


def test_outside_sbatch_a_preempted_srun_is_started_again(tmp_path):
    """Without SLURM_JOB_ID the script starts srun again with --resume after a preemption,
    at most MAX_RESTARTS times, and ends with the status of the start that did not."""
    proc, calls, requeues = slurm_train(tmp_path, 'preempted-killed ok')
    assert proc.returncode == 0, proc.stderr
    assert len(calls) == 2 and all(call.endswith('--resume') for call in calls)
    assert requeues == []
    assert 'starting again with --resume (1/3)' in proc.stderr

    (tmp_path / 'again').mkdir()
    proc, calls, _ = slurm_train(tmp_path / 'again', 'preempted fail')
    assert proc.returncode == 1 and len(calls) == 2


def test_preempted_more_often_than_max_restarts_gives_up(tmp_path):
    proc, calls, _ = slurm_train(tmp_path, 'preempted preempted preempted preempted ok')
    assert proc.returncode == PREEMPTED_EXIT_CODE
    assert len(calls) == 4  # the first start and MAX_RESTARTS=3 more
    assert 'preempted 4 times, giving up (MAX_RESTARTS=3)' in proc.stderr


def test_the_marker_is_read_in_a_work_dir_given_among_the_train_arguments(tmp_path):
    """A --work-dir after WORK_DIR overrides it in train.py: the marker is read there."""
    other = tmp_path / 'other'
    other.mkdir()
    for form in (['--work-dir', str(other)], [f'--work-dir={other}']):
        for name in ('bin', 'work', 'calls', 'requeues'):
            subprocess.run(['rm', '-rf', str(tmp_path / name)], check=True)
        proc, calls, requeues = slurm_train(tmp_path, 'preempted-killed', job_id='7',
                                            args=form)
        assert proc.returncode == PREEMPTED_EXIT_CODE, proc.stderr
        assert requeues == ['requeue 7']
        assert not (tmp_path / 'work' / PREEMPTED_MARKER).exists()


@pytest.mark.parametrize('srun_args', ['--chdir {}', '--chdir={}', '-D {}', '-D{}'])
def test_a_relative_work_dir_is_read_below_sruns_chdir(tmp_path, srun_args):
    """With --chdir / -D in SRUN_ARGS the tasks resolve a relative WORK_DIR below that folder:
    the marker is read there (and a stale one removed there)."""
    tasks = tmp_path / 'tasks'
    (tasks / 'work').mkdir(parents=True)
    (tasks / 'work' / PREEMPTED_MARKER).write_text('an earlier preemption\n')
    proc, calls, requeues = slurm_train(tmp_path, 'preempted-killed', job_id='9',
                                        work_dir='work', srun_args=srun_args.format(tasks))
    assert proc.returncode == PREEMPTED_EXIT_CODE, proc.stderr
    assert requeues == ['requeue 9']
    assert (tasks / 'work' / PREEMPTED_MARKER).read_text().startswith('preempted after')

    for name in ('bin', 'work', 'calls', 'requeues'):
        subprocess.run(['rm', '-rf', str(tmp_path / name)], check=True)
    (tasks / 'work' / PREEMPTED_MARKER).write_text('an earlier preemption\n')
    proc, _, requeues = slurm_train(tmp_path, 'killed', job_id='9', work_dir='work',
                                    srun_args=srun_args.format(tasks))
    assert proc.returncode == 137 and requeues == []
    assert not (tasks / 'work' / PREEMPTED_MARKER).exists()


def test_a_task_dir_in_the_environment_does_not_move_the_marker(tmp_path, monkeypatch):
    """Only SRUN_ARGS' --chdir moves a relative work dir: a TASK_DIR the user's environment
    happens to export is not read."""
    monkeypatch.setenv('TASK_DIR', str(tmp_path / 'elsewhere'))
    proc, _, requeues = slurm_train(tmp_path, 'preempted-killed', job_id='5', work_dir='work')
    assert proc.returncode == PREEMPTED_EXIT_CODE, proc.stderr
    assert requeues == ['requeue 5']


def test_the_script_reads_the_marker_the_hook_writes():
    with open(SLURM_TRAIN) as f:
        assert f'MARKER="$RUN_DIR/{PREEMPTED_MARKER}"' in f.read()
    assert f'"$work/{PREEMPTED_MARKER}"' in FAKE_SRUN


def test_an_empty_work_dir_is_refused_before_srun(tmp_path):
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    (bin_dir / 'srun').write_text('#!/usr/bin/env bash\ntouch "$CALLS"\n')
    (bin_dir / 'srun').chmod(0o755)
    env = dict(os.environ, PATH=f'{bin_dir}:{os.environ["PATH"]}', CALLS=str(tmp_path / 'c'))
    proc = subprocess.run(['bash', SLURM_TRAIN, 'part', 'job', 'configs/x.py', ''],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ('error: WORK_DIR is empty: name the folder the run writes '
                                   'its checkpoints to')
    assert not (tmp_path / 'c').exists()
