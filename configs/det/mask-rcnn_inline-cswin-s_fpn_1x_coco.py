# Mask R-CNN + FPN, InLine-CSwin-S, 1x, COCO (recipe as InLine-CSwin-T, drop path 0.3).
_base_ = './mask-rcnn_inline-cswin-t_fpn_1x_coco.py'

checkpoint = 'checkpoints/inline_cswin_s.pth'
model = dict(backbone=dict(arch='small', drop_path_rate=0.3,
                           init_cfg=dict(type='Pretrained', checkpoint=checkpoint)))
