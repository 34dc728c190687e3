"""The README.md and metafile.yml of the ``projects/InLine/`` folder (export_project.py).

The metafile is the zoo's own less the toy runs, its paths moved into the project; the
README follows the toolkits' ``projects/example_project`` template, its results table
built from that metafile.
"""
import os.path as osp

import yaml

import _metafile
import _zoo

CITATION = """@inproceedings{han2024bridging,
  title     = {Bridging the Divide: Reconsidering Softmax and Linear Attention},
  author    = {Han, Dongchen and Pu, Yifan and Xia, Zhuofan and Han, Yizeng and Pan, Xuran and
               Li, Xiu and Lu, Jiwen and Song, Shiji and Huang, Gao},
  booktitle = {Advances in Neural Information Processing Systems (NeurIPS)},
  year      = {2024}
}"""


def project_metafile(folder: str, project: str) -> str:
    """The zoo's ``folder/metafile.yml`` as the project's: the toy runs (inline-mm's demos)
    left out, paths in ``projects/<project>/``."""
    with open(osp.join(_zoo.ROOT, folder, 'metafile.yml')) as f:
        text = f.read()
    for model in yaml.safe_load(text).get('Models') or []:
        if '/toy/' in model.get('Config', ''):
            start, end, _ = _metafile.find_entry(text, model['Name'])
            lines = text.split('\n')
            text = '\n'.join(lines[:start] + lines[end:])
    text = text.replace(f'{folder}/README.md', f'projects/{project}/README.md')
    return text.replace(f'Config: {folder}/', f'Config: projects/{project}/configs/')


def _metric(entry: dict, name: str) -> str:
    values = [(r.get('Metrics') or {}).get(name) for r in entry.get('Results') or []]
    return next((str(v) for v in values if v is not None), '-')


def readme_text(toolkit: str, toolkit_name: str, meta: dict, project: str, module: str) -> str:
    """The project's README.md in the toolkit's project template, its results table from
    the metafile's entries (``meta``); ``module``: the import path of the project's code."""
    models = meta.get('Models') or []
    first = osp.basename(models[0]['Config']) if models else 'CONFIG.py'
    rows = []
    for m in models:
        md, config = m['Metadata'], osp.relpath(m['Config'], f'projects/{project}')
        download = f"[model]({m['Weights']})" if m.get('Weights') else '-'
        rows.append(
            f"| [Mask R-CNN]({config}) | {md.get('Backbone', '-')} | ImageNet-1K (authors') | "
            f"COCO2017 Train | COCO2017 Val | {md.get('Epochs', '-')} | {_metric(m, 'box AP')} "
            f"| {_metric(m, 'mask AP')} | {download} |" if toolkit == 'mmdet' else
            f"| {md.get('Head', '-')} | {md.get('Backbone', '-')} | {md.get('Crop Size', '-')} | "
            f"{md.get('Iterations', '-')} | {md.get('Training Memory (GB)', '-')} | "
            f"{_metric(m, 'mIoU')} | {_metric(m, 'mAcc')} | [config]({config}) | {download} |")
    header = ('| Method | Backbone | Pretrained Model | Training set | Test set | #epoch | '
              'box AP | mask AP | Download |\n'
              '| :----: | :------: | :--------------: | :----------: | :------: | :----: | '
              ':----: | :-----: | :------: |') if toolkit == 'mmdet' else (
        '| Method | Backbone | Crop Size | Lr schd | Mem (GB) | mIoU | mAcc | config '
        '| download |\n'
        '| ------ | -------- | --------- | ------: | -------- | ---: | ---: | ------ '
        '| -------- |')
    dataset = 'COCO' if toolkit == 'mmdet' else 'ADE20K'
    status = ('Results of this project\'s own training runs (box / mask AP on COCO val2017 '
              'or mIoU on ADE20K val, single scale).' if any(m.get('Results') for m in models)
              else 'No full schedule has been trained with these configs yet: the results '
              'columns stay empty until one is measured; the backbones start from the '
              'authors\' ImageNet-1K weights, converted on load.')
    return f"""# InLine: Injective Linear Attention Backbones

## Description

Author: the inline-mm contributors.

This project brings the InLine (injective linear attention) vision backbones of
[Bridging the Divide: Reconsidering Softmax and Linear Attention](https://arxiv.org/abs/2412.06590)
(NeurIPS 2024) to {toolkit_name}: `InLinePVT`, `InLineSwin`, `InLineCSWin` and `InLineDeiT`,
registered in `{toolkit}.registry.MODELS` when `{module}` is imported. The authors
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
