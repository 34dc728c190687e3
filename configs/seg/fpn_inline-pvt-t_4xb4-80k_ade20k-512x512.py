# Semantic FPN, InLine-PVT-T, ADE20K 512x512, 80k iterations (4 GPUs x 4 images):
# mmseg's Semantic FPN recipe with the PVT paper's schedule (AdamW 1e-4, weight
# decay 1e-4, poly decay power 0.9, 80k iterations), no weight decay on position
# tables and norms.  Weights: checkpoints/inline_pvt_t.pth (authors' ImageNet-1K).
_base_ = ['mmseg::sem_fpn/fpn_r50_4xb4-160k_ade20k-512x512.py',
          '../_base_/runtime/inline_mm_runtime.py']
custom_imports = dict(imports=['inline_mm', 'inline_mm.engine'],
                      allow_failed_imports=False)
# missing / truncated images and label maps are skipped and logged, up to 1 %
train_dataloader = dict(dataset=dict(type='SkipBadSamples', dataset_type='ADE20KDataset',
                                     max_bad_fraction=0.01))

checkpoint = 'checkpoints/inline_pvt_t.pth'
model = dict(
    pretrained=None,
    backbone=dict(
        _delete_=True, type='InLinePVT', arch='tiny', drop_path_rate=0.1,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=checkpoint)),
    neck=dict(in_channels=[64, 128, 320, 512]))

max_iters = 80000
train_cfg = dict(max_iters=max_iters, val_interval=8000)
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook', interval=8000))
optim_wrapper = dict(
    _delete_=True, type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=1e-4),
    paramwise_cfg=dict(custom_keys={
        'pos_embed': dict(decay_mult=0.),
        'norm': dict(decay_mult=0.)}))
param_scheduler = [
    dict(type='PolyLR', eta_min=0.0, power=0.9, begin=0, end=max_iters, by_epoch=False)
]
# the total batch size the learning rate is set for (tools/train.py --auto-scale-lr)
auto_scale_lr = dict(enable=False, base_batch_size=16)
