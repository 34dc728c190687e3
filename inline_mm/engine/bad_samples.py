"""Bad training samples skipped instead of ending the run (:class:`SkipBadSamples`).

mmengine's datasets stop the run at the first image that cannot be read, decode a
truncated JPEG silently (grey where the data stop), and mmdet drops zero-area boxes
without a word.  :class:`SkipBadSamples` (a dataset wrapper, or the dataset's type in
place) finds missing, empty or truncated images / label maps, samples whose pipeline
raises and degenerate annotations, skips them deterministically, logs each file once
across data-loader workers, and stops the run with :class:`BadSampleLimitError`
listing the files once there are more than a limit.
"""
import fcntl
import logging
import os
import os.path as osp
import secrets
import tempfile
import weakref
from typing import Any, Dict, List, Optional, Tuple, Union

from mmengine.logging import print_log
from mmengine.registry import DATASETS


class BadSampleLimitError(RuntimeError):
    """More bad samples than a :class:`SkipBadSamples` wrapper allows."""


def _degenerate_polygon(poly: Any) -> bool:
    if not isinstance(poly, (list, tuple)) or len(poly) < 6 or len(poly) % 2:
        return True
    xs, ys = poly[0::2], poly[1::2]
    area = 0.5 * abs(sum(xs[i] * ys[i - 1] - xs[i - 1] * ys[i] for i in range(len(xs))))
    return area <= 0


def annotation_problem(raw: Any, info: Any) -> Optional[str]:
    """What is degenerate in one sample's annotations (None when nothing is).

    Looks at the raw COCO annotations (``raw_ann_info``: mmdet's
    ``CocoDataset`` drops zero-area boxes silently when it parses them) and at
    the parsed ``instances`` (``bbox`` as x1, y1, x2, y2; polygon masks).
    """
    anns = raw.get('raw_ann_info') if isinstance(raw, dict) else None
    for ann in anns or []:
        if ann.get('iscrowd', 0):
            continue
        x, y, w, h = (list(ann.get('bbox', [])) + [0, 0, 0, 0])[:4]
        if w <= 0 or h <= 0 or ann.get('area', 1) <= 0:
            return f'zero-area box {ann.get("bbox")} (annotation id {ann.get("id")})'
        seg = ann.get('segmentation')
        if isinstance(seg, list) and (not seg or any(_degenerate_polygon(p) for p in seg)):
            return f'degenerate polygon (annotation id {ann.get("id")})'
    instances = info.get('instances') if isinstance(info, dict) else None
    for inst in instances or []:
        if inst.get('ignore_flag', 0):
            continue
        box = inst.get('bbox')
        if box is not None and len(box) == 4 and (box[2] <= box[0] or box[3] <= box[1]):
            return f'zero-area box {list(box)}'
        mask = inst.get('mask')
        if isinstance(mask, list) and (not mask or any(_degenerate_polygon(p) for p in mask)):
            return 'degenerate polygon'
    return None


def file_problem(path: Optional[str]) -> Optional[str]:
    """Why an image / label file cannot be read in full (None when it looks intact).

    Cheap: size, and the end-of-image marker of JPEG / PNG files (OpenCV
    decodes a truncated JPEG without an error, grey where the data stop).
    """
    if not path or '://' in path:
        return None
    if not osp.isfile(path):
        return 'file not found'
    size = osp.getsize(path)
    if size == 0:
        return 'empty file'
    ext = osp.splitext(path)[1].lower()
    if ext in ('.jpg', '.jpeg', '.png'):
        with open(path, 'rb') as f:
            f.seek(max(0, size - 4096))
            tail = f.read()
        if ext == '.png' and b'IEND' not in tail[-32:]:
            return 'truncated PNG (no IEND chunk)'
        if ext != '.png' and b'\xff\xd9' not in tail:
            return 'truncated JPEG (no end-of-image marker)'
    return None


def _remove_record(path: str, owner: int) -> None:
    """Remove the bad-sample record of a :class:`SkipBadSamples` made by ``owner``."""
    if os.getpid() == owner:
        try:
            os.remove(path)
        except OSError:
            pass


#: the removal of each wrapper's record (weakref.finalize; each runs once at most)
_RECORD_REMOVALS: List[weakref.finalize] = []


def remove_bad_sample_records() -> None:
    """Remove the records of this process's wrappers now.

    For an exit through ``os._exit`` (the bounded teardown of
    :mod:`inline_mm.engine.dist`), which skips the removal at interpreter exit.
    """
    for removal in _RECORD_REMOVALS:
        removal()


@DATASETS.register_module()
class SkipBadSamples:
    """Dataset wrapper that skips bad samples instead of ending the run.

    A sample is bad when its image or label map is missing, empty or
    truncated, when loading it through the pipeline raises, or when its
    annotations hold a zero-area box or a degenerate polygon (checked once,
    when the annotations are parsed).  A bad sample is replaced by the next
    good index (deterministic: no random state is drawn), its file is logged
    once with the reason, and it is counted.  When the number of distinct bad
    files exceeds the limit, the run stops with :class:`BadSampleLimitError`
    listing them.

    Data-loader workers share what they found through a small file (one
    line per bad sample, written under a lock), so each file is logged once
    and counted once per training process whatever ``num_workers`` is.

    Two ways to write it in a config: as a wrapper,
    ``dict(type='SkipBadSamples', dataset=dict(type='CocoDataset', ...))``, or in
    place, ``dict(type='SkipBadSamples', dataset_type='CocoDataset', data_root=...,
    pipeline=[...])``: the second keeps every key path of the dataset config
    (``train_dataloader.dataset.data_root``, ``...dataset.pipeline.3.prob``) as
    it was, so ``--cfg-options`` written for the plain dataset keep working.

    Args:
        dataset: the dataset or its config (wrapper form).
        max_bad_fraction: the run stops when more than this fraction of the
            dataset is bad. Defaults to 0.01.
        max_bad_count: an absolute limit instead of the fraction.
        check_annotations: check the parsed annotations for zero-area boxes
            and degenerate polygons. Defaults to True.
        lazy_init: as for mmengine's datasets.
        dataset_type: the dataset type (in-place form).
        **dataset_kwargs: the dataset's own arguments (in-place form).
    """

    def __init__(self, dataset: Union[dict, Any, None] = None, max_bad_fraction: float = 0.01,
                 max_bad_count: Optional[int] = None, check_annotations: bool = True,
                 lazy_init: bool = False, dataset_type: Union[str, type, None] = None,
                 **dataset_kwargs: Any) -> None:
        if dataset is None:
            if dataset_type is None:
                raise TypeError('SkipBadSamples needs dataset=dict(...) or dataset_type=...')
            dataset = dict(type=dataset_type, **dataset_kwargs)
        elif dataset_kwargs or dataset_type is not None:
            raise TypeError(f'SkipBadSamples got both dataset= and dataset arguments '
                            f'{sorted(dataset_kwargs)}')
        self.max_bad_fraction = max_bad_fraction
        self.max_bad_count = max_bad_count
        self.check_annotations = check_annotations
        self._bad: Dict[int, Tuple[str, str]] = {}  # index -> (file, reason)
        # the file the data-loader workers share what they found through; made by the
        # first bad sample (most runs have none, and leave nothing behind even when
        # killed).  A random name nobody can plant a file or link at beforehand
        self._record = osp.join(tempfile.gettempdir(),
                                f'inline_mm_bad_samples_{secrets.token_hex(16)}.tsv')
        # removed when the wrapper is collected or, at the latest, when the process
        # that made it exits (__del__ alone is not called for objects alive at exit);
        # not in the forked data-loader workers, which share the file
        _RECORD_REMOVALS[:] = [r for r in _RECORD_REMOVALS if r.alive]
        _RECORD_REMOVALS.append(weakref.finalize(self, _remove_record, self._record,
                                                 os.getpid()))
        # a subset (mmengine's ``indices``) lists some of a folder's images on purpose
        self._subset = dataset.get('indices') is not None if isinstance(dataset, dict) else \
            getattr(dataset, '_indices', None) is not None  # a built one: no public getter
        if isinstance(dataset, dict):
            dataset = DATASETS.build(dict(dataset, lazy_init=True)
                                     if _is_base_dataset(dataset) else dataset)
        self.dataset = dataset
        self._fully_initialized = False
        if not lazy_init:
            self.full_init()

    # -- delegation -----------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith('__') or name in ('dataset', '_bad', '_record'):
            raise AttributeError(name)
        return getattr(self.dataset, name)

    @property
    def metainfo(self) -> dict:
        return self.dataset.metainfo

    def __len__(self) -> int:
        return len(self.dataset)

    def get_data_info(self, idx: int) -> Any:
        return self.dataset.get_data_info(idx)

    def full_init(self) -> None:
        """Parse the annotations (checking each sample's) and apply the limit."""
        if self._fully_initialized:
            return
        # a dataset built before the wrapper parsed its annotations already: full_init()
        # returns at once and nothing is checked (the wrapper builds its own lazily)
        if self.check_annotations and hasattr(self.dataset, 'parse_data_info'):
            found: List[Tuple[dict, str]] = []
            parse = self.dataset.parse_data_info

            def checked_parse(raw: Any) -> Any:
                info = parse(raw)
                problem = annotation_problem(raw, info)
                if problem is not None and isinstance(info, dict):
                    found.append((info, problem))
                return info

            self.dataset.parse_data_info = checked_parse  # instance attribute, removed below
            try:
                self.dataset.full_init()
            finally:
                del self.dataset.parse_data_info
            by_path = {info.get('img_path'): problem for info, problem in found}
            if by_path:
                for idx in range(len(self.dataset)):
                    info = self.dataset.get_data_info(idx)
                    path = info.get('img_path') if isinstance(info, dict) else None
                    if path is not None and path in by_path:
                        self._add_bad(idx, path, by_path[path])
        elif hasattr(self.dataset, 'full_init'):
            self.dataset.full_init()
        for k, path in enumerate(self._label_maps_without_image()):
            self._add_bad(-1 - k, path, 'image missing')  # no index: not a sample of the set
        self._fully_initialized = True
        self._check_limit()

    def _label_maps_without_image(self) -> List[str]:
        """The label maps of an mmseg set listed from its image folder whose image is missing.

        mmseg lists such a set's images (``img_dir``, no ``ann_file``), so a deleted
        image would leave its sample out silently.
        """
        ds = self.dataset
        prefix = getattr(ds, 'data_prefix', None) or {}
        img_dir, seg_dir = prefix.get('img_path'), prefix.get('seg_map_path')
        img_suffix, seg_suffix = getattr(ds, 'img_suffix', None), getattr(ds, 'seg_map_suffix',
                                                                           None)
        ann_file = getattr(ds, 'ann_file', '')
        if not (img_dir and seg_dir and isinstance(img_suffix, str) and
                isinstance(seg_suffix, str)) or (ann_file and not osp.isdir(ann_file)) or \
                self._subset or '://' in seg_dir or \
                not osp.isdir(seg_dir):
            return []
        from mmengine.fileio import list_dir_or_file
        listed = {ds.get_data_info(i).get('seg_map_path') for i in range(len(ds))}
        return [osp.join(seg_dir, name) for name in sorted(list_dir_or_file(
                    seg_dir, list_dir=False, suffix=seg_suffix, recursive=True))
                if osp.join(seg_dir, name) not in listed and not osp.isfile(
                    osp.join(img_dir, name[:-len(seg_suffix)] + img_suffix))]

    # -- bad-sample bookkeeping ----------------------------------------------
    @property
    def limit(self) -> int:
        """How many bad files are allowed."""
        if self.max_bad_count is not None:
            return int(self.max_bad_count)
        return int(self.max_bad_fraction * len(self.dataset))

    def _sync(self) -> None:
        """Merge what other processes (data-loader workers) recorded."""
        try:
            with open(self._record) as f:
                for line in f:
                    idx, path, reason = line.rstrip('\n').split('\t', 2)
                    self._bad.setdefault(int(idx), (path, reason))
        except (OSError, ValueError):
            pass

    def _add_bad(self, idx: int, path: str, reason: str) -> None:
        """Record a bad sample once across workers; log it the first time."""
        reason = ' '.join(reason.split())[:300]
        fd = os.open(self._record, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, 'a+') as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                self._sync()
                if idx not in self._bad:
                    self._bad[idx] = (path, reason)
                    f.write(f'{idx}\t{path}\t{reason}\n')
                    f.flush()
                    print_log(f'skipped bad sample {path}: {reason} ({len(self._bad)} bad '
                              f'so far, limit {self.limit})', logger='current',
                              level=logging.WARNING)
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _check_limit(self) -> None:
        if len(self._bad) > self.limit:
            listing = '\n'.join(f'  {path}: {reason}' for path, reason in
                                sorted(self._bad.values()))
            rule = 'max_bad_count' if self.max_bad_count is not None else \
                f'max_bad_fraction={self.max_bad_fraction} of {len(self.dataset)}'
            raise BadSampleLimitError(
                f'{len(self._bad)} bad samples in the training set, more than the limit of '
                f'{self.limit} ({rule}); fix or remove these files:\n{listing}')

    @property
    def bad_samples(self) -> Dict[int, Tuple[str, str]]:
        """Index -> (file, reason) of the bad samples found so far by this process."""
        self._sync()
        return dict(self._bad)

    def _paths(self, idx: int) -> List[str]:
        info = self.dataset.get_data_info(idx)
        if not isinstance(info, dict):
            return []
        return [info[k] for k in ('img_path', 'seg_map_path') if isinstance(info.get(k), str)]

    def __getitem__(self, idx: int) -> Any:
        if not self._fully_initialized:
            self.full_init()
        n = len(self.dataset)
        for step in range(n):
            cur = (idx + step) % n
            if cur in self._bad:
                continue
            paths = self._paths(cur)
            bad = paths[0] if paths else f'index {cur}'
            try:
                for path in paths:
                    problem = file_problem(path)
                    if problem is not None:
                        bad = path  # the file to fix: the label map, when it is the one
                        raise OSError(f'{problem}: {path}')
                return self.dataset[cur]
            except Exception as err:  # any failure of this sample: skip it, keep the run
                self._add_bad(cur, bad, f'{type(err).__name__}: {err}')
                self._check_limit()
        raise BadSampleLimitError('every sample of the training set is bad')


def _is_base_dataset(cfg: dict) -> bool:
    """Whether the dataset config builds an mmengine ``BaseDataset`` (takes ``lazy_init``)."""
    from mmengine.dataset import BaseDataset
    cls = cfg.get('type')
    if isinstance(cls, str):
        try:
            with DATASETS.switch_scope_and_registry(None) as registry:
                cls = registry.get(cls)
        except Exception:  # an unknown type fails in the build with a clear message
            return False
    return isinstance(cls, type) and issubclass(cls, BaseDataset)
