# UperNet, InLine-CSwin-T, ADE20K 512x512, 160k: the Swin UperNet recipe with the
# backbone swapped.  Weights: checkpoints/inline_cswin_t.pth (authors' ImageNet-1K).
_base_ = ['mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py',
          '../_base_/runtime/inline_mm_runtime.py']
custom_imports = dict(imports=['inline_mm', 'inline_mm.engine'],
                      allow_failed_imports=False)
# missing / truncated images and label maps are skipped and logged, up to 1 %
train_dataloader = dict(dataset=dict(type='SkipBadSamples', dataset_type='ADE20KDataset',
                                     max_bad_fraction=0.01))
# atomic checkpoints, resume from the newest readable one (docs/reliability.md)
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook'))

checkpoint = 'checkpoints/inline_cswin_t.pth'
model = dict(
    pretrained=None,
    backbone=dict(
        _delete_=True, type='InLineCSWin', arch='tiny', drop_path_rate=0.3,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=checkpoint)),
    decode_head=dict(in_channels=[64, 128, 256, 512]),
    auxiliary_head=dict(in_channels=256))
# the total batch size the learning rate is set for (tools/train.py --auto-scale-lr)
auto_scale_lr = dict(enable=False, base_batch_size=16)
# the stem's LayerNorm keeps the authors' name (stage1_conv_embed.2), which the base's
# custom key 'norm' does not match: no decay on it either (the heads' norms as in the base)
optim_wrapper = dict(paramwise_cfg=dict(custom_keys={'stage1_conv_embed.2': dict(decay_mult=0.)}))
