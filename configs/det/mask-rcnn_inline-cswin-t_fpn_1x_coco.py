# Mask R-CNN + FPN, InLine-CSwin-T, 1x, COCO: the Swin-T 1x recipe (AdamW 1e-4,
# weight decay 0.05, no decay on norms) with the backbone swapped.
# Weights: checkpoints/inline_cswin_t.pth (authors' ImageNet-1K).
_base_ = ['mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py',
          '../_base_/runtime/inline_mm_runtime.py']
custom_imports = dict(imports=['inline_mm', 'inline_mm.engine'],
                      allow_failed_imports=False)
# atomic checkpoints, resume from the newest readable one (docs/reliability.md)
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook'))
# a mid-epoch (preemption) checkpoint resumes after its last batch, not at the epoch's start
train_cfg = dict(type='ResumableEpochBasedTrainLoop')
# missing / broken images and degenerate annotations are skipped and logged, up to 1 %
train_dataloader = dict(dataset=dict(type='SkipBadSamples', dataset_type='CocoDataset',
                                     max_bad_fraction=0.01))

checkpoint = 'checkpoints/inline_cswin_t.pth'
model = dict(
    backbone=dict(
        _delete_=True, type='InLineCSWin', arch='tiny', drop_path_rate=0.2,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=checkpoint)),
    neck=dict(in_channels=[64, 128, 256, 512]))
# the stem's LayerNorm keeps the authors' name (stage1_conv_embed.2), which the base's
# custom key 'norm' does not match: no decay on it either (the heads' norms as in the base)
optim_wrapper = dict(paramwise_cfg=dict(custom_keys={'stage1_conv_embed.2': dict(decay_mult=0.)}))
