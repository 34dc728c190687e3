# Mask R-CNN + FPN, InLine-PVT-S, 1x, COCO (recipe as InLine-PVT-T).
_base_ = './mask-rcnn_inline-pvt-t_fpn_1x_coco.py'

checkpoint = 'checkpoints/inline_pvt_s.pth'
model = dict(backbone=dict(arch='small', drop_path_rate=0.1,
                           init_cfg=dict(type='Pretrained', checkpoint=checkpoint)))
