# UperNet, InLine-DeiT-S, ADE20K 512x512, 160k: mmseg's DeiT-S UperNet recipe with
# its MultiLevelNeck (rescales the four stride-16 outputs of blocks 3/6/9/12 to
# strides 4/8/16/32), AdamW 6e-5, no decay on pos_embed / cls_token / norms.
# Weights: checkpoints/inline_deit_s.pth (authors' ImageNet-1K, trained at 288;
# the position table is resized to the 32x32 grid of a 512 crop at run time).
_base_ = ['mmseg::vit/vit_deit-s16_mln_upernet_8xb2-160k_ade20k-512x512.py',
          '../_base_/runtime/inline_mm_runtime.py']
custom_imports = dict(imports=['inline_mm', 'inline_mm.engine'],
                      allow_failed_imports=False)
# missing / truncated images and label maps are skipped and logged, up to 1 %
train_dataloader = dict(dataset=dict(type='SkipBadSamples', dataset_type='ADE20KDataset',
                                     max_bad_fraction=0.01))
# atomic checkpoints, resume from the newest readable one (docs/reliability.md)
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook'))

checkpoint = 'checkpoints/inline_deit_s.pth'
model = dict(
    pretrained=None,
    backbone=dict(
        _delete_=True, type='InLineDeiT', arch='small', drop_path_rate=0.1,
        out_indices=(2, 5, 8, 11), final_norm=True,
        init_cfg=dict(type='Pretrained', checkpoint=checkpoint)),
    neck=dict(in_channels=[320, 320, 320, 320], out_channels=320),
    decode_head=dict(in_channels=[320, 320, 320, 320]),
    auxiliary_head=dict(in_channels=320))
# the total batch size the learning rate is set for (tools/train.py --auto-scale-lr)
auto_scale_lr = dict(enable=False, base_batch_size=16)
