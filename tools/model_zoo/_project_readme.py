"""The README.md and metafile.yml of the ``projects/InLine/`` folder (export_project.py).

The metafile is the zoo's own (``configs/det`` or ``configs/seg``) less the toy runs,
its paths moved into the project; the README follows the toolkits'
``projects/example_project`` template, its results table built from that metafile.
"""
import os.path as osp
from typing import Tuple

import _metafile
import _zoo

CITATION = """@inproceedings{han2024bridging,
  title     = {Bridging the Divide: Reconsidering Softmax and Linear Attention},
  author    = {Han, Dongchen and Pu, Yifan and Xia, Zhuofan and Han, Yizeng and Pan, Xuran and
               Li, Xiu and Lu, Jiwen and Song, Shiji and Huang, Gao},
  booktitle = {Advances in Neural Information Processing Systems (NeurIPS)},
  year      = {2024}
}"""


def write_metafile(out: str, folder: str, project: str) -> Tuple[str, dict]:
    """The zoo's ``folder/metafile.yml`` as the project's (``out/metafile.yml``): the toy
    runs left out, paths in ``projects/<project>/``; returns its path and its entries."""
    with open(osp.join(_zoo.ROOT, folder, 'metafile.yml')) as f:
        text = f.read()
    import yaml
    # the toy runs are inline-mm's demos, not models of the project
    for model in yaml.safe_load(text).get('Models') or []:
        if '/toy/' in model.get('Config', ''):
            start, end, _ = _metafile.find_entry(text, model['Name'])
            lines = text.split('\n')
            text = '\n'.join(lines[:start] + lines[end:])
    text = text.replace(f'{folder}/README.md', f'projects/{project}/README.md')
    text = text.replace(f'Config: {folder}/', f'Config: projects/{project}/configs/')
    path = osp.join(out, 'metafile.yml')
    with open(path, 'w') as f:
        f.write(text)
    return path, yaml.safe_load(text)


def _metric(entry: dict, name: str) -> str:
    for result in entry.get('Results') or []:
        value = (result.get('Metrics') or {}).get(name)
        if value is not None:
            return str(value)
    return '-'


def _download(entry: dict) -> str:
    weights = entry.get('Weights')
    return f'[model]({weights})' if weights else '-'


def readme_text(toolkit: str, toolkit_name: str, meta: dict, project: str,
                import_path: str) -> str:
    """The project's README.md in the toolkit's project template, its results table from
    the metafile's entries (``meta``)."""
    models = meta.get('Models') or []
    first = osp.basename(models[0]['Config']) if models else 'CONFIG.py'
    if toolkit == 'mmdet':
        header = ('| Method | Backbone | Pretrained Model | Training set | Test set | #epoch | '
                  'box AP | mask AP | Download |\n'
                  '| :----: | :------: | :--------------: | :----------: | :------: | :----: | '
                  ':----: | :-----: | :------: |')
        rows = [f"| [Mask R-CNN]({osp.relpath(m['Config'], f'projects/{project}')}) | "
                f"{m['Metadata'].get('Backbone', '-')} | ImageNet-1K (authors') | COCO2017 Train "
                f"| COCO2017 Val | {m['Metadata'].get('Epochs', '-')} | "
                f"{_metric(m, 'box AP')} | {_metric(m, 'mask AP')} | {_download(m)} |"
                for m in models]
    else:
        header = ('| Method | Backbone | Crop Size | Lr schd | Mem (GB) | mIoU | mAcc | config '
                  '| download |\n'
                  '| ------ | -------- | --------- | ------: | -------- | ---: | ---: | ------ '
                  '| -------- |')
        rows = [f"| {m['Metadata'].get('Head', '-')} | {m['Metadata'].get('Backbone', '-')} | "
                f"{m['Metadata'].get('Crop Size', '-')} | {m['Metadata'].get('Iterations', '-')} "
                f"| {m['Metadata'].get('Training Memory (GB)', '-')} | {_metric(m, 'mIoU')} | "
                f"{_metric(m, 'mAcc')} | [config]("
                f"{osp.relpath(m['Config'], f'projects/{project}')}) | {_download(m)} |"
                for m in models]
    trained = any(m.get('Results') for m in models)
    dataset = 'COCO' if toolkit == 'mmdet' else 'ADE20K'
    status = ('Results of this project\'s own training runs (box / mask AP on COCO val2017 '
              'or mIoU on ADE20K val, single scale).' if trained else
              'No full schedule has been trained with these configs yet: the results columns '
              'stay empty until one is measured; the backbones start from the authors\' '
              'ImageNet-1K weights, converted on load.')
    return f"""# InLine: Injective Linear Attention Backbones

## Description

Author: the inline-mm contributors.

This project brings the InLine (injective linear attention) vision backbones of
[Bridging the Divide: Reconsidering Softmax and Linear Attention](https://arxiv.org/abs/2412.06590)
(NeurIPS 2024) to {toolkit_name}: `InLinePVT`, `InLineSwin`, `InLineCSWin` and `InLineDeiT`,
registered in `{toolkit}.registry.MODELS` when `{import_path}` is imported. The authors
released ImageNet-1K classification code and weights only; the configs put their backbones
into {toolkit_name}'s own recipes (their bases are the toolkit's configs), and the backbones
load the authors' checkpoints as released through `init_cfg` (read with `weights_only`
semantics; position tables resized to the input). Any input size works (odd and
non-square included): InLine attention costs linear time in the number of pixels.

## Usage

### Prerequisites

- Python 3.10 or higher, PyTorch 2.1 or higher, timm 1.0 or higher
- {toolkit_name} ({toolkit} {'3.x' if toolkit == 'mmdet' else '1.x'}), mmengine 0.10.3 or higher

Download the authors' ImageNet-1K checkpoints from
[LeapLabTHU/InLine](https://github.com/LeapLabTHU/InLine#pretrained-models) into
`checkpoints/` of {toolkit_name}'s root (`inline_pvt_t.pth`, `inline_swin_t.pth`, ...).

All the commands below run in {toolkit_name}'s root directory, with the root on `PYTHONPATH`
so that Python finds `projects.{project}`:

```shell
export PYTHONPATH=`pwd`:$PYTHONPATH
```

### Training commands

```shell
python tools/train.py projects/{project}/configs/{first}
```

For multi-gpu training, run:

```shell
bash tools/dist_train.sh projects/{project}/configs/{first} ${{NUM_GPUS}}
```

### Testing commands

```shell
python tools/test.py projects/{project}/configs/{first} ${{CHECKPOINT_PATH}}
```

## Results

{status}

{header}
{chr(10).join(rows)}

## Citation

```bibtex
{CITATION}
```

## Checklist

- [ ] Milestone 1: PR-ready, and acceptable to be one of the `projects/`.

  - [x] Finish the code

    <!-- Each backbone is registered into `{toolkit}.registry.MODELS` and configured
    through a config file. -->

  - [x] Basic docstrings & proper citation

  - [ ] Test-time correctness

    <!-- The backbones equal the authors' models (every variant within 7e-6 at 224x224,
    inline-mm's tools/verify_against_reference.py); no {dataset} result of the paper has
    been reproduced yet. -->

  - [x] A full README

- [ ] Milestone 2: Indicates a successful model implementation.

  - [ ] Training-time correctness

- [ ] Milestone 3: Good to be a part of our core package!

  - [x] Type hints and docstrings

  - [ ] Unit tests

    <!-- The tests live in inline-mm (pytest suite); none are in this folder yet. -->

  - [ ] Code polishing

  - [x] Metafile.yml

- [ ] Move your modules into the core package following the codebase's file hierarchy structure.

- [ ] Refactor your modules into the core package following the codebase's file hierarchy structure.
"""
